"""The compute dtype: `auto` is bf16 where the CPU computes it faster than float32, else float32."""
import json
from dataclasses import dataclass
from pathlib import Path

import torch

AUTO = "auto"
DTYPE_NAMES = ("bfloat16", "float16", "float32")
DTYPE_CHOICES = (AUTO, *DTYPE_NAMES)


@dataclass(frozen=True, slots=True)
class Hardware:
    """What decides the dtype: a GPU, or a CPU by kind: bf16 instructions (AVX512_BF16, AMX tiles) and vendor."""

    cuda: bool
    cpu_native_bf16: bool  # AVX512_BF16 or AMX: bf16 is not emulated
    cpu_capability: str  # torch's dispatch level, e.g. "AVX2" or "AVX512"
    cpu_amx: bool = False  # Intel's AMX tiles (Sapphire Rapids and later)
    cpu_vendor: str = ""  # CPUID's vendor string, e.g. "GenuineIntel", "AuthenticAMD"

    @classmethod
    def detect(cls) -> "Hardware":
        """This machine, as torch sees it (CPUID), and its vendor from /proc/cpuinfo."""
        amx = torch.cpu._is_amx_tile_supported()
        native = torch.cpu._is_avx512_bf16_supported() or amx
        return cls(torch.cuda.is_available(), native, torch.backends.cpu.get_cpu_capability(), amx, cpu_vendor())

    @property
    def cpu_fast_bf16(self) -> bool:
        """Whether bf16 computes faster than float32 here: AMX tiles, or AVX512_BF16 on AMD (Zen 4 and later)."""
        # On an Intel Xeon with AVX512_BF16 but no AMX a one-thread bf16 matmul ran at 69 GFLOP/s against
        # float32's 82; on AMD Zen 5 a blended replay's TTFT was 1.35x lower in bf16
        # (docs/studies/request_planner.md).
        return self.cpu_amx or (self.cpu_native_bf16 and self.cpu_vendor == "AuthenticAMD")

    @property
    def description(self) -> str:
        """One line for logs and results, e.g. "cpu AVX512, native bf16"."""
        if self.cuda:
            return f"cuda {torch.cuda.get_device_name()}"
        native = f"native bf16{' (AMX)' if self.cpu_amx else ''}" if self.cpu_native_bf16 else "emulated bf16"
        return f"cpu {self.cpu_capability}, {native}"


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's vendor string ("GenuineIntel", "AuthenticAMD"), "" where the file does not say."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id")), "")


def choose_dtype(requested: str, hardware: Hardware, model_dtype: str = "bfloat16", on_gpu: bool | None = None) -> str:
    """The dtype name to compute in; `auto`: the model's own on a GPU, bf16 on a CPU where faster, else float32."""
    if requested not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {requested!r}")
    if requested != AUTO:
        return requested
    if hardware.cuda if on_gpu is None else on_gpu:
        return model_dtype if model_dtype in DTYPE_NAMES else "bfloat16"
    # Emulated bf16 is ~100x slower than float32 in torch matmuls (Zen 3: 1.2 vs 138 GFLOP/s).
    return "bfloat16" if hardware.cpu_fast_bf16 else "float32"


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
