"""Overload: clients far beyond capacity get 429 with Retry-After quickly, memory stays bounded, and the
service fully recovers once the load drops."""
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster.conftest import running_app
from tests.cluster.test_serving import MODEL, metric

pytestmark = pytest.mark.slow

MIB = 1 << 20
DEVICE_BYTES, RAM_BYTES = 64 * MIB, 64 * MIB
# Beyond the tier capacities: request bodies and responses in flight, Python and Ray buffers under load.
STATED_OVERHEAD_BYTES = 768 * MIB
NUM_CLIENTS = 48
LOAD_S = 40.0
REFUSAL_BOUND_S = 2.0
CONFIG: dict[str, Any] = {
    "workers": {"num_replicas": 1, "num_cpus": 1},
    "engine": {"kind": "torch", "num_threads": 1},
    "guardrails": {"canary": False},
    "admission": {"max_queued_per_worker": 4, "initial_service_time_s": 2.0},
    "limits": {"max_tokens": 16, "default_max_tokens": 4},
    "server": {"trust_tenant_header": True, "max_requests_in_flight_per_tenant": 8},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("ov")
    tiers = [
        {"name": "device", "url": "device://", "capacity_bytes": DEVICE_BYTES},
        {"name": "ram", "url": "ram://", "capacity_bytes": RAM_BYTES},
        {"name": "ssd", "url": f"file://{root / 'ssd'}", "capacity_bytes": 1 << 30},
    ]
    with running_app(root, {**CONFIG, "tiers": tiers}) as base_url:
        yield base_url, root


def session_rss_bytes(root: Path) -> int:
    """Resident memory of every process of this test's Ray session (found by the TMPDIR they inherited)."""
    total = 0
    marker = f"TMPDIR={root}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker not in Path(f"/proc/{pid}/environ").read_bytes():
                continue
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        rss_kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        total += rss_kib * 1024
    return total


def request(client: httpx.Client, base_url: str, i: int) -> tuple[int, float, str | None]:
    """One question over a few documents (new ones now and then, so the cache keeps filling)."""
    docs = [f"Note {i % 50}: the lighthouse on cape {i % 50} was lit in {1800 + i % 50}.", "Ships pass at night."]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "When was the lighthouse lit?"}],
            "documents": [{"text": d} for d in docs], "max_tokens": 4}
    start_s = time.monotonic()
    try:
        response = client.post(f"{base_url}/v1/chat/completions", json=body, headers={"X-Tenant": f"t{i % 4}"})
    except httpx.HTTPError:
        return 0, time.monotonic() - start_s, None
    return response.status_code, time.monotonic() - start_s, response.headers.get("Retry-After")


def test_clients_far_beyond_capacity_get_429_fast_memory_stays_bounded_and_service_recovers(server) -> None:
    base_url, root = server
    warm = httpx.post(f"{base_url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Warm up?"}], "max_tokens": 2})
    assert warm.status_code == 200
    baseline_bytes = session_rss_bytes(root)
    results: list[tuple[int, float, str | None]] = []
    peak_bytes = baseline_bytes
    stop = threading.Event()

    def client_loop(index: int) -> None:
        with httpx.Client(timeout=120) as client:
            n = index
            while not stop.is_set():
                results.append(request(client, base_url, n))
                n += NUM_CLIENTS

    with ThreadPoolExecutor(NUM_CLIENTS) as pool:
        for index in range(NUM_CLIENTS):
            pool.submit(client_loop, index)
        deadline_s = time.monotonic() + LOAD_S
        health_s = []
        while time.monotonic() < deadline_s:
            peak_bytes = max(peak_bytes, session_rss_bytes(root))
            start_s = time.monotonic()
            assert httpx.get(f"{base_url}/healthz", timeout=10).status_code == 200
            health_s.append(time.monotonic() - start_s)
            time.sleep(1.0)
        stop.set()

    refused = [r for r in results if r[0] == 429]
    served = [r for r in results if r[0] == 200]
    assert {status for status, _, _ in results} <= {200, 429}, sorted({s for s, _, _ in results})
    assert len(refused) > len(served) > 0
    assert all(retry is not None and int(retry) >= 1 for _, _, retry in refused)
    refusal_s = sorted(took for _, took, _ in refused)
    logging.getLogger(__name__).info(
        "overload: %d requests in %.0f s from %d clients: %d served, %d refused (429); refusal p50 %.3f s, p99 %.3f s;"
        " /healthz max %.3f s; session RSS %.0f MiB at rest, peak %.0f MiB",
        len(results), LOAD_S, NUM_CLIENTS, len(served), len(refused), refusal_s[len(refusal_s) // 2],
        refusal_s[int(0.99 * (len(refusal_s) - 1))], max(health_s), baseline_bytes / MIB, peak_bytes / MIB,
    )
    assert refusal_s[int(0.99 * (len(refusal_s) - 1))] < REFUSAL_BOUND_S, refusal_s[-10:]
    assert max(health_s) < REFUSAL_BOUND_S
    assert peak_bytes - baseline_bytes < DEVICE_BYTES + RAM_BYTES + STATED_OVERHEAD_BYTES, (peak_bytes, baseline_bytes)

    # Recovery: the queues drain and a lone request is served as before the load.
    deadline_s = time.monotonic() + 120
    while metric(base_url, "blendserve_queue_depth") > 0 and time.monotonic() < deadline_s:
        time.sleep(1.0)
    assert metric(base_url, "blendserve_queue_depth") == 0
    with httpx.Client(timeout=120) as client:
        status, took_s, _ = request(client, base_url, 10_000)
    assert status == 200 and took_s < 30
