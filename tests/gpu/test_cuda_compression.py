"""Compressed chunk KV decoded in the GPU's memory equals the host's decoding (skipped on CPU machines)."""
import pytest
import torch

from kvplane.compression.registry import compression

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_on_the_gpu_equals_decoding_on_the_host(name: str, dtype: torch.dtype) -> None:
    codec = compression(name)
    layers = torch.randn(4, 2, 100, 3, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    stored = torch.stack([codec.compress(layer) for layer in layers])  # [4, layer bytes]
    host = codec.decompress(stored, tuple(layers.shape[1:]), dtype)
    device = codec.decompress(stored.cuda(), tuple(layers.shape[1:]), dtype)
    assert device.device.type == "cuda"
    torch.testing.assert_close(device.cpu(), host, rtol=0, atol=0)
    gpu_encoded = torch.stack([codec.compress(layer) for layer in layers.cuda()])
    assert torch.equal(gpu_encoded.cpu(), stored)
