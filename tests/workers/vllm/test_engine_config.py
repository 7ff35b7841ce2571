"""The process preparation for vLLM: the kernel-override scan survives llvmlite (numba) in the process."""
import importlib.util
import sys

import pytest

from workers.vllm.engine_config import guard_kernel_scan


def test_vllm_kernel_scan_passes_over_llvmlite_after_the_guard() -> None:
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("llvmlite") is None:
        pytest.skip("vllm and llvmlite are not both installed in this environment")
    import llvmlite.binding.ffi  # noqa: F401  (what `import numba` loads)
    from vllm.triton_utils.dispatcher import _rebind_kernels

    assert "llvmlite.binding.ffi" in sys.modules
    guard_kernel_scan()
    _rebind_kernels([])  # the scan over every module: raised AttributeError on llvmlite's `lib` before the guard
    assert vars(sys.modules["llvmlite.binding.ffi"].lib) == {}
