"""Compressions of one layer: sizes as declared, errors within half a quantization step, batched = one by one."""
import pytest
import torch

from kvplane.compression.base import CompressionError
from kvplane.compression.int4 import Int4
from kvplane.compression.registry import COMPRESSIONS, compression

LOSSY = ("int8", "int4")


def _layer(tokens: int, heads: int = 3, dim: int = 64, seed: int = 0) -> torch.Tensor:
    """A layer `[2, T, H_kv, D]` shaped like real KV: a few key channels far from zero, small values."""
    generator = torch.Generator().manual_seed(seed)
    layer = torch.randn(2, tokens, heads, dim, generator=generator)
    layer[0, :, :, ::16] += 12.0  # outlier key channels, as keys have
    layer[1] *= 0.2
    return layer


@pytest.mark.parametrize("name", sorted(COMPRESSIONS))
@pytest.mark.parametrize("tokens", [1, 63, 64, 200])
def test_compressed_size_is_the_declared_one(name: str, tokens: int) -> None:
    codec, layer = compression(name), _layer(tokens)
    data = codec.compress(layer)
    assert data.dtype == torch.uint8 and data.dim() == 1
    assert data.numel() == codec.layer_nbytes(tuple(layer.shape), layer.dtype)


@pytest.mark.parametrize(("name", "min_ratio"), [("int8", 1.9), ("int4", 3.5)])
def test_bytes_against_bfloat16_at_the_default_models_shape(name: str, min_ratio: float) -> None:
    shape = (2, 128, 3, 64)  # a 128-token chunk of SmolLM2-135M: 3 KV heads of 64 channels
    bf16_nbytes = compression("none").layer_nbytes(shape, torch.bfloat16)
    assert bf16_nbytes / compression(name).layer_nbytes(shape, torch.bfloat16) >= min_ratio


def test_no_compression_is_exact_and_a_view() -> None:
    codec, layer = compression("none"), _layer(10)
    data = codec.compress(layer)
    out = codec.decompress(data[None], tuple(layer.shape), layer.dtype)
    assert torch.equal(out[0], layer)
    assert out.data_ptr() == data.data_ptr()


def test_int8_errors_are_within_half_a_step_per_key_channel_and_value_token() -> None:
    codec, layer = compression("int8"), _layer(100)
    out = codec.decompress(codec.compress(layer)[None], tuple(layer.shape), torch.float32)[0]
    key_step = layer[0].abs().amax(dim=0) / 127  # [H, D]
    value_step = layer[1].abs().amax(dim=-1, keepdim=True) / 127  # [T, H, 1]
    # float16 scales round the step by at most 2^-11 of itself; 127 steps of that is the extra allowance.
    assert ((out[0] - layer[0]).abs() <= key_step * (0.5 + 127 * 2**-11) + 1e-6).all()
    assert ((out[1] - layer[1]).abs() <= value_step * (0.5 + 127 * 2**-11) + 1e-6).all()


def test_int8_keeps_ordinary_key_channels_precise_beside_outliers() -> None:
    codec, layer = compression("int8"), _layer(100)
    out = codec.decompress(codec.compress(layer)[None], tuple(layer.shape), torch.float32)[0]
    ordinary = [channel for channel in range(64) if channel % 16]
    error = (out[0, :, :, ordinary] - layer[0, :, :, ordinary]).abs().max()
    assert error <= layer[0, :, :, ordinary].abs().max() / 127  # one step of their own range, not the outliers'


@pytest.mark.parametrize("tokens", [1, 64, 100])
def test_int4_errors_are_within_half_a_step_of_each_group(tokens: int) -> None:
    codec, layer = Int4("int4-test", key_group=32, value_group=16), _layer(tokens)
    out = codec.decompress(codec.compress(layer)[None], tuple(layer.shape), torch.float32)[0]
    # Minimum and step are float16: each rounds by up to 2^-11 of itself, which widens the bound.
    for start in range(0, tokens, 32):
        keys = layer[0, start : start + 32]
        low = keys.amin(dim=0)
        step = (keys.amax(dim=0) - low) / 15
        bound = step * (0.5 + 15 * 2**-11) + low.abs() * 2**-11 + 1e-6
        assert ((out[0, start : start + 32] - keys).abs() <= bound).all()
    values = layer[1].view(tokens, 3, 4, 16)
    low = values.amin(dim=-1, keepdim=True)
    step = (values.amax(dim=-1, keepdim=True) - low) / 15
    error = (out[1].view(tokens, 3, 4, 16) - values).abs()
    assert (error <= step * (0.5 + 15 * 2**-11) + low.abs() * 2**-11 + 1e-6).all()


@pytest.mark.parametrize("name", LOSSY)
def test_several_layers_decode_in_one_call_as_one_by_one(name: str) -> None:
    codec = compression(name)
    layers = [_layer(77, seed=seed) for seed in range(4)]
    data = torch.stack([codec.compress(layer) for layer in layers])
    together = codec.decompress(data, tuple(layers[0].shape), torch.float32)
    for index in range(4):
        alone = codec.decompress(data[index : index + 1], tuple(layers[0].shape), torch.float32)[0]
        assert torch.equal(together[index], alone)


@pytest.mark.parametrize("name", LOSSY)
def test_decoding_into_bfloat16_rounds_the_float32_result(name: str) -> None:
    codec, layer = compression(name), _layer(20).bfloat16()
    data = codec.compress(layer)[None]
    wide = codec.decompress(data, tuple(layer.shape), torch.float32)
    narrow = codec.decompress(data, tuple(layer.shape), torch.bfloat16)
    assert narrow.dtype == torch.bfloat16
    assert torch.equal(narrow, wide.bfloat16())


@pytest.mark.parametrize("name", LOSSY)
def test_values_beyond_float16_range_are_refused(name: str) -> None:
    layer = _layer(8)
    layer[1, 3, 0, 0] = 1e7  # int8 scale 1e7 / 127 and int4 step 1e7 / 15 both exceed 65504
    with pytest.raises(CompressionError, match="float16"):
        compression(name).compress(layer)


def test_int4_refuses_an_odd_head_dim_and_unknown_names_are_named() -> None:
    with pytest.raises(CompressionError, match="head dim"):
        compression("int4").compress(torch.zeros(2, 4, 1, 7))
    with pytest.raises(ValueError, match="int8"):
        compression("zstd")
