"""The compute dtype: `auto` by the hardware, concrete names kept, and KV of two dtypes never shares a key."""
import json
from pathlib import Path

import pytest
import torch

from workers.chunks.kvplane_store import chunk_store_key
from workers.model.dtype import (
    AUTO,
    Hardware,
    checkpoint_dtype,
    choose_dtype,
    cpu_vendor,
    dtype_width_bytes,
    measured_on,
    torch_dtype,
)
from workers.model.fingerprint import model_fingerprint

AMD, INTEL = "AuthenticAMD", "GenuineIntel"
ZEN3 = Hardware(cuda=False, cpu_native_bf16=False, cpu_capability="AVX2", cpu_vendor=AMD)
ZEN4 = Hardware(cuda=False, cpu_native_bf16=True, cpu_capability="AVX512", cpu_vendor=AMD)
XEON_AMX = Hardware(cuda=False, cpu_native_bf16=True, cpu_capability="AVX512", cpu_amx=True, cpu_vendor=INTEL)
XEON_BF16_NO_AMX = Hardware(cuda=False, cpu_native_bf16=True, cpu_capability="AVX512", cpu_vendor=INTEL)
GPU = Hardware(cuda=True, cpu_native_bf16=False, cpu_capability="AVX2", cpu_vendor=INTEL)


@pytest.mark.parametrize(
    "hardware,model_dtype,expected",
    [(ZEN3, "bfloat16", "float32"), (ZEN4, "bfloat16", "bfloat16"), (ZEN4, "float32", "bfloat16"),
     (XEON_AMX, "bfloat16", "bfloat16"), (XEON_BF16_NO_AMX, "bfloat16", "float32"),
     (GPU, "bfloat16", "bfloat16"), (GPU, "float16", "float16"), (GPU, "float32", "float32")],
)
def test_auto_follows_the_hardware_and_on_gpu_the_model(hardware: Hardware, model_dtype: str, expected: str) -> None:
    assert choose_dtype(AUTO, hardware, model_dtype) == expected


def test_a_concrete_dtype_is_kept_and_a_cpu_engine_on_a_gpu_machine_picks_by_the_cpu() -> None:
    for name in ("bfloat16", "float16", "float32"):
        assert choose_dtype(name, ZEN3) == name
    assert choose_dtype(AUTO, GPU, "bfloat16", on_gpu=False) == "float32"  # its CPU has no native bf16
    with pytest.raises(ValueError, match="dtype must be one of"):
        choose_dtype("int8", ZEN4)


def test_checkpoint_dtype_reads_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert checkpoint_dtype(tmp_path) == "float16"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    assert checkpoint_dtype(tmp_path) == "float32"
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_dtype(tmp_path) == "bfloat16"


def test_detected_hardware_matches_torch() -> None:
    hardware = Hardware.detect()
    assert hardware.cpu_capability == torch.backends.cpu.get_cpu_capability()
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert hardware.cpu_native_bf16 == native
    assert hardware.cpu_amx == torch.cpu._is_amx_tile_supported()
    assert hardware.cpu_vendor in {AMD, INTEL, ""}
    assert measured_on(torch.float32) == {"dtype": "float32", "hardware": hardware.description}


def test_cpu_vendor_reads_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n")
    assert cpu_vendor(cpuinfo) == AMD
    cpuinfo.write_text("processor\t: 0\n")
    assert cpu_vendor(cpuinfo) == ""
    assert cpu_vendor(tmp_path / "missing") == ""


def test_widths_and_names() -> None:
    assert [dtype_width_bytes(n) for n in ("float32", "bfloat16", "float16", "")] == [4, 2, 2, 2]
    assert torch_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="concrete dtype"):
        torch_dtype(AUTO)


def test_kv_of_two_dtypes_is_filed_under_different_keys(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    bf16, fp32 = model_fingerprint(tmp_path, "bfloat16"), model_fingerprint(tmp_path, "float32")
    assert bf16 != fp32
    ids = [1, 2, 3]
    assert chunk_store_key(bf16, "default", ids, []) != chunk_store_key(fp32, "default", ids, [])
