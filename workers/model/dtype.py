"""The compute dtype: `auto` is bf16 where the hardware computes it natively, float32 where bf16 is emulated."""
import json
from dataclasses import dataclass
from pathlib import Path

import torch

AUTO = "auto"
DTYPE_NAMES = ("bfloat16", "float16", "float32")
DTYPE_CHOICES = (AUTO, *DTYPE_NAMES)


@dataclass(frozen=True, slots=True)
class Hardware:
    """What decides the dtype: a GPU, or a CPU with or without native bf16 (AVX512_BF16 or AMX tiles)."""

    cuda: bool
    cpu_native_bf16: bool
    cpu_capability: str  # torch's dispatch level, e.g. "AVX2" or "AVX512"

    @classmethod
    def detect(cls) -> "Hardware":
        """This machine, as torch sees it (CPUID, not /proc)."""
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        return cls(torch.cuda.is_available(), native, torch.backends.cpu.get_cpu_capability())

    @property
    def description(self) -> str:
        """One line for logs and results, e.g. "cpu AVX512, native bf16"."""
        if self.cuda:
            return f"cuda {torch.cuda.get_device_name()}"
        return f"cpu {self.cpu_capability}, {'native' if self.cpu_native_bf16 else 'emulated'} bf16"


def choose_dtype(requested: str, hardware: Hardware, model_dtype: str = "bfloat16", on_gpu: bool | None = None) -> str:
    """The dtype name to compute in; `auto`: the model's own on a GPU, bf16 on a native-bf16 CPU, else float32."""
    if requested not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {requested!r}")
    if requested != AUTO:
        return requested
    if hardware.cuda if on_gpu is None else on_gpu:
        return model_dtype if model_dtype in DTYPE_NAMES else "bfloat16"
    # Emulated bf16 is ~100x slower than float32 in torch matmuls (Zen 3: 1.2 vs 138 GFLOP/s).
    return "bfloat16" if hardware.cpu_native_bf16 else "float32"


def measured_on(dtype: torch.dtype | str) -> dict[str, str]:
    """What a result file records next to its figures: the dtype and the hardware it was computed on."""
    return {"dtype": str(dtype).removeprefix("torch."), "hardware": Hardware.detect().description}


def checkpoint_dtype(model_path: Path) -> str:
    """The dtype a Hugging Face checkpoint was saved in (config.json), bfloat16 when it does not say."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    return name if name in DTYPE_NAMES else "bfloat16"


def resolve_dtype(requested: str, model_path: Path, on_gpu: bool | None = None) -> str:
    """`requested` made concrete for this machine and checkpoint (`on_gpu`: None means whether a GPU is present)."""
    model_dtype = checkpoint_dtype(model_path) if requested == AUTO else requested
    return choose_dtype(requested, Hardware.detect(), model_dtype, on_gpu)


def dtype_width_bytes(name: str) -> int:
    """Bytes per value of a concrete dtype; 2 (bf16) for a worker that has not said yet."""
    return torch_dtype(name).itemsize if name in DTYPE_NAMES else 2


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a concrete dtype name."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"a concrete dtype is one of {DTYPE_NAMES}, got {name!r}")
    return getattr(torch, name)
