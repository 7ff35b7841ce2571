"""Compressed chunk KV decoded in the GPU's memory equals the host's decoding (skipped on CPU machines)."""
import pytest
import torch

from kvplane.compression.registry import compression
from kvplane.entry import KVEntry
from kvplane.keys import chunk_key
from kvplane.store import TieredStore
from kvplane.tiers.spec import TierSpec

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


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_a_host_tier_streams_compressed_bytes_to_the_gpu_and_decodes_them_there(name: str, tmp_path) -> None:
    kv = torch.randn(3, 2, 80, 3, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    entry = KVEntry(chunk_key("fp", "tenant", list(range(80))), kv, list(range(80)), "fp")
    spec = TierSpec("ssd", f"file://{tmp_path}", 1 << 26, "lru", compression=name)
    with TieredStore.from_specs([spec]) as store:
        store.put(entry)
        store.flush()
        on_gpu = list(store.read_layers(entry.key, decode_device=torch.device("cuda")))
        on_host = torch.stack(list(store.read_layers(entry.key)))
    assert {layer.device.type for layer in on_gpu} == {"cuda"}
    torch.testing.assert_close(torch.stack(on_gpu).cpu(), on_host, rtol=0, atol=0)
