"""Rotary position embeddings, and exact re-rotation of cached keys to a new offset."""
import math
from collections.abc import Callable

import torch

from workers.model.config import RopeConfig

KeyRotation = Callable[[int, torch.Tensor, int], torch.Tensor]
"""(layer, cached keys [T, H_kv, D] rotated for positions p, delta) -> the keys rotated for p + delta, with that
layer's RoPE (a runner's rerotate_keys: layers of one model may rotate differently, e.g. Gemma 3's two bases)."""


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Per-pair rotation speed in radians per position. # [D/2]"""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_frequencies(inv_freq, rope)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """Llama 3.1 scaling: slow long wavelengths down by `factor`, keep short ones, blend between."""
    low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * inv_freq / rope.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotation tables for the given positions, in float32. # [T, D] each"""
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    angles = torch.cat([angles, angles], dim=-1)  # [T, D]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x by the tables' angles (rotate-half layout). x: [T, H, D]; cos, sin: [T, D] or [T, D/2] (only the
    first half is read: both halves repeat the same angles), or [1, ...] for one angle set."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]  # [T, H, D/2] each
    c, s = cos[:, None, :half], sin[:, None, :half]  # both halves of the tables repeat the same angles
    # on the halves: ~4x faster than rotating a concatenated copy, and the same floats
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def rerotate(k: torch.Tensor, inv_freq: torch.Tensor, delta_positions: int) -> torch.Tensor:
    """Move keys cached at positions p to p + delta: R(p + d) = R(d) R(p). k: [..., T, H, D]"""
    if delta_positions == 0:
        return k
    cos, sin = cos_sin(inv_freq, torch.tensor([delta_positions]))
    cos, sin = cos.to(k.device), sin.to(k.device)
    shape = k.shape
    flat = k.reshape(-1, shape[-2], shape[-1])
    return apply_rope(flat, cos, sin).reshape(shape)
