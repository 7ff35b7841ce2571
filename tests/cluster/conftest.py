"""A real Ray Serve deployment of the app on loopback: two worker replicas, the default model, temp data dir."""
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.local_ray import free_port, local_serve

SERVE_CONFIG = {
    "workers": {"num_replicas": 2, "num_cpus": 1},
    "engine": {"kind": "torch", "num_threads": 1},  # the cheap reference engine; test_vllm_serving.py runs vLLM
    # As asked, never planned: these tests read the blend stats of the mode they ask for (the planner's own
    # path over HTTP runs in tests/helm's replay and test_vllm_serving.py).
    "fusion": {"plan": "blend"},
    "admission": {"max_queued_per_worker": 2, "initial_service_time_s": 2.0},
    "guardrails": {"shadow_fraction": 1.0},  # every blended request is also compared with full prefill
    "limits": {"max_documents": 8, "max_tokens": 64, "default_max_tokens": 16, "max_request_body_bytes": 65536},
    "server": {"trust_tenant_header": True},  # tenants by X-Tenant, as a trusted proxy in front would set it
}
READY_TIMEOUT_S = 240


def _wait_ready(base_url: str, num_workers: int, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            metrics = httpx.get(f"{base_url}/metrics", timeout=5, headers=headers).text
            if f"blendserve_workers_ready {float(num_workers)}" in metrics:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"the app did not report {num_workers} ready workers within {READY_TIMEOUT_S} s")


@contextmanager
def running_app(root: Path, config: dict[str, Any], headers: dict[str, str] | None = None) -> Iterator[str]:
    """Ray, Serve and the app under `root` with `config`; yields the base URL once every worker is ready."""
    # `headers` go with the readiness probe (an API key when the app requires one for /metrics).
    from ray import serve

    from cluster.app import build_app

    port = free_port()
    with local_serve(root, num_cpus=4, object_store_bytes=200 << 20, http_port=port):
        serve.run(build_app({**config, "data_dir": str(root / "data")}), name="blendserve",
                  route_prefix="/", blocking=False)
        base_url = f"http://127.0.0.1:{port}"
        _wait_ready(base_url, config["workers"]["num_replicas"], headers)
        yield base_url


@dataclass(frozen=True, slots=True)
class Served:
    """The running app's base URL and the configuration it serves (its data_dir filled in)."""

    base_url: str
    config: dict[str, Any]


def compressed_tiers(data_dir: Path) -> list[dict[str, Any]]:
    """The default tiers, the node's RAM configured as int4 and its SSD as int8."""
    return [
        {"name": "device", "url": "device://", "capacity_bytes": 512 << 20},
        {"name": "ram", "url": "ram://", "capacity_bytes": 1 << 30, "compression": "int4"},
        {"name": "ssd", "url": f"file://{data_dir / 'kv'}", "capacity_bytes": 16 << 30, "compression": "int8"},
    ]


def record_verdicts(data_dir: Path, passed: dict[str, bool]) -> None:
    """Compression verdicts of the default model as a worker records them, so no worker measures at start."""
    from kvplane.compression.verdicts import VERDICT_FOLDER, VerdictBook
    from workers.model.default import prepare_default_model
    from workers.model.dtype import resolve_dtype
    from workers.model.fingerprint import model_fingerprint

    path = prepare_default_model()
    fingerprint = model_fingerprint(path, resolve_dtype("auto", path, on_gpu=False))
    book = VerdictBook(f"file://{data_dir / VERDICT_FOLDER}")
    for name, verdict in passed.items():
        book.put(fingerprint, name, {"passed": verdict, "recorded_by": "tests/cluster/conftest.py"})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The running app; Ray, Serve and every actor are stopped afterwards. This process is Ray's driver.

    The node's tiers are compressed (RAM int4, SSD int8) under verdicts recorded beforehand: int8 passed, int4
    refused; the gate's measurement itself is tested on the model in tests/workers/guardrails.
    """
    root = tmp_path_factory.mktemp("serve")
    record_verdicts(root / "data", {"int8": True, "int4": False})
    config = {**SERVE_CONFIG, "tiers": compressed_tiers(root / "data")}
    with running_app(root, config) as base_url:
        yield Served(base_url, {**config, "data_dir": str(root / "data")})


@pytest.fixture(scope="module")
def server(served: Served) -> str:
    """Base URL of the running app."""
    return served.base_url
