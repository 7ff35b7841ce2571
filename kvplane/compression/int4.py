"""Asymmetric 4-bit in groups (KIVI-style): keys per channel over groups of tokens, values per token over groups
of channels."""
import math

import torch

from kvplane.compression.base import Compression, CompressionError, float32_output

# Liu et al., "KIVI: a tuning-free asymmetric 2bit quantization for KV cache" (ICML 2024): keys quantized per
# channel, values per token, each group with its own minimum and step. Two values share a byte; minimum and
# step are float16.
_LEVELS = 15.0
_MIN_STEP = 2.0**-14


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., D] codes in 0..15 -> [..., D / 2] bytes, the even channel in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _group_range(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(minimum, step) in float16 over `dim` (kept as size 1)."""
    low = x.amin(dim=dim, keepdim=True)
    step = ((x.amax(dim=dim, keepdim=True) - low) / _LEVELS).clamp_min(_MIN_STEP)
    low16, step16 = low.half(), step.half()
    if not bool(torch.isfinite(low16).all() and torch.isfinite(step16).all()):
        raise CompressionError("a value is beyond float16's range; int4 cannot scale it")
    return low16, step16


def _codes(x: torch.Tensor, low: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    return torch.round((x - low.float()) / step.float()).clamp_(0, _LEVELS).to(torch.uint8)


class Int4(Compression):
    """Half a byte a value; float16 minimum and step per `key_group` tokens of a key channel and per
    `value_group` channels (or the whole head, if smaller) of a value token."""

    def __init__(self, name: str, key_group: int, value_group: int) -> None:
        if key_group < 1 or value_group < 2 or value_group % 2:
            raise ValueError(f"groups must be >= 1 token and an even channel count, got {key_group}, {value_group}")
        self.name, self.key_group, self.value_group = name, key_group, value_group

    def layer_nbytes(self, layer_shape: tuple[int, ...], dtype: torch.dtype) -> int:
        _, tokens, heads, dim = self._check(layer_shape)
        key_groups = math.ceil(tokens / self.key_group) * heads * dim
        value_groups = tokens * heads * (dim // self._value_group(dim))
        return tokens * heads * dim + 4 * key_groups + 4 * value_groups

    def compress(self, layer: torch.Tensor) -> torch.Tensor:
        _, tokens, heads, dim = self._check(tuple(layer.shape))
        keys, values = layer[0].float(), layer[1].float()  # [T, H_kv, D]
        padded = math.ceil(tokens / self.key_group) * self.key_group
        # The last group is padded with copies of the last token, which leaves its range unchanged.
        grouped = torch.cat([keys, keys[-1:].expand(padded - tokens, heads, dim)]).view(-1, self.key_group, heads, dim)
        key_low, key_step = _group_range(grouped, 1)  # [G_k, 1, H_kv, D]
        key_codes = _codes(grouped, key_low, key_step).view(padded, heads, dim)[:tokens]
        split = values.view(tokens, heads, dim // self._value_group(dim), -1)
        value_low, value_step = _group_range(split, -1)  # [T, H_kv, D / g, 1]
        value_codes = _codes(split, value_low, value_step).view(tokens, heads, dim)
        parts = (_pack(key_codes), _pack(value_codes), key_low, key_step, value_low, value_step)
        return torch.cat([part.reshape(-1).view(torch.uint8) for part in parts])

    def decompress(self, data: torch.Tensor, layer_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        _, tokens, heads, dim = self._check(layer_shape)
        layers, half, groups = data.shape[0], tokens * heads * dim // 2, dim // self._value_group(dim)
        num_key_groups = math.ceil(tokens / self.key_group)
        key_table, value_table = num_key_groups * heads * dim * 2, tokens * heads * groups * 2
        tables = data[:, 2 * half :]
        key_shape, value_shape = (layers, num_key_groups, 1, heads, dim), (layers, tokens, heads, groups, 1)
        key_low = tables[:, :key_table].view(torch.float16).view(key_shape).float()
        key_step = tables[:, key_table : 2 * key_table].view(torch.float16).view(key_shape).float()
        value_low = tables[:, 2 * key_table : 2 * key_table + value_table].view(torch.float16).view(value_shape)
        value_step = tables[:, 2 * key_table + value_table :].view(torch.float16).view(value_shape)
        out = float32_output(layers, layer_shape, data.device)
        # Codes first, written in place (even channels from low nibbles, odd from high), then step and minimum.
        pairs = out.view(layers, 2, tokens, heads, dim // 2, 2)
        packed = data[:, : 2 * half].view(layers, 2, tokens, heads, dim // 2)
        pairs[..., 0].copy_(packed & 15)
        pairs[..., 1].copy_(packed >> 4)
        keys, full = out[:, 0], tokens // self.key_group * self.key_group
        if full:
            whole = keys[:, :full].view(layers, -1, self.key_group, heads, dim)
            whole.mul_(key_step[:, : full // self.key_group]).add_(key_low[:, : full // self.key_group])
        if full < tokens:
            keys[:, full:].mul_(key_step[:, -1]).add_(key_low[:, -1])
        values = out[:, 1].view(layers, tokens, heads, groups, -1)
        values.mul_(value_step.float()).add_(value_low.float())
        return out if dtype == torch.float32 else out.to(dtype)

    def _value_group(self, dim: int) -> int:
        """Channels per value group: the configured count, or the whole head when it is smaller."""
        return min(self.value_group, dim)

    def _check(self, layer_shape: tuple[int, ...]) -> tuple[int, ...]:
        dim = layer_shape[-1]
        if len(layer_shape) != 4 or dim % 2 or dim % self._value_group(dim):
            raise CompressionError(f"{self.name} needs an even head dim, a multiple of {self.value_group} or below it; "
                                   f"got {dim}")
        return layer_shape
