"""Symmetric int8: keys scaled per channel over the chunk's tokens, values per token over their channels."""
import torch

from kvplane.compression.base import Compression, CompressionError, float32_output

# Keys carry a few channels with large magnitudes across all tokens, so one scale per channel keeps the
# others precise; values have no such channels and vary by token (the KIVI observation, Liu et al. 2024).
# Scales are float16: 2 bytes a token and KV head for values, amortised over the chunk for keys.
_LEVELS = 127.0
_MIN_SCALE = 2.0**-14  # float16's smallest normal: a channel of zeros still gets a usable scale


def _scales(absmax: torch.Tensor) -> torch.Tensor:
    scale = (absmax.float() / _LEVELS).clamp_min(_MIN_SCALE).half()
    if not bool(torch.isfinite(scale).all()):
        raise CompressionError("a value is beyond float16's range; int8 cannot scale it")
    return scale


def _quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.round(x.float() / scale.float()).clamp_(-_LEVELS, _LEVELS).to(torch.int8)


class Int8(Compression):
    """1 byte a value plus float16 scales: keys `[H_kv, D]` per chunk, values `[T, H_kv]`."""

    name = "int8"

    def layer_nbytes(self, layer_shape: tuple[int, ...], dtype: torch.dtype) -> int:
        _, tokens, heads, dim = layer_shape
        return 2 * tokens * heads * dim + 2 * heads * dim + 2 * tokens * heads

    def compress(self, layer: torch.Tensor) -> torch.Tensor:
        keys, values = layer[0], layer[1]  # [T, H_kv, D] each
        key_scale = _scales(keys.abs().amax(dim=0))  # [H_kv, D]
        value_scale = _scales(values.abs().amax(dim=-1))  # [T, H_kv]
        parts = (
            _quantize(keys, key_scale).reshape(-1).view(torch.uint8),
            _quantize(values, value_scale[..., None]).reshape(-1).view(torch.uint8),
            key_scale.reshape(-1).view(torch.uint8),
            value_scale.reshape(-1).view(torch.uint8),
        )
        return torch.cat(parts)

    def decompress(self, data: torch.Tensor, layer_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        _, tokens, heads, dim = layer_shape
        count = tokens * heads * dim
        codes = data[:, : 2 * count].view(torch.int8).view(-1, 2, tokens, heads, dim)
        key_scale = data[:, 2 * count : 2 * count + 2 * heads * dim].view(torch.float16).view(-1, 1, heads, dim)
        value_scale = data[:, 2 * count + 2 * heads * dim :].view(torch.float16).view(-1, tokens, heads, 1)
        out = float32_output(data.shape[0], layer_shape, data.device)
        out.copy_(codes)
        out[:, 0].mul_(key_scale.float())
        out[:, 1].mul_(value_scale.float())
        return out if dtype == torch.float32 else out.to(dtype)
