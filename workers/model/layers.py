"""The transformer math as plain functions: RMSNorm, attention with position (and window) masks, gated MLP."""
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

# Sparse queries are split into this many position-sorted groups, so each group attends only to
# keys up to its last position: ~1.3x less attention work than one masked call over all keys.
NUM_QUERY_GROUPS = 4
# Up to this many queries (decode steps, short suffixes) plain batched matmuls beat the CPU flash kernel ~8x:
# the kernel parallelises over query blocks, and a handful of queries fills only one.
MAX_SHORT_QUERIES = 64

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    """Root-mean-square norm computed in float32, returned in x's dtype. x: [..., hidden]

    Llama-style (offset 0) scales the rounded normalised x by the weight; Gemma-style (offset 1) scales by
    (1 + weight) in float32 and rounds once, as each family's reference does.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight_offset:
        return (xf * (weight_offset + weight.float())).to(x.dtype)
    return weight * xf.to(x.dtype)


def gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """Gated MLP (SwiGLU, GeGLU). x: [S, hidden]; gate_up: [2I, hidden]; down: [hidden, I]."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(ACTIVATIONS[activation](gate) * up, down)


def visible_keys(q_positions: torch.Tensor, key_positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """Which keys each query sees: at or before its position and, with a window, less than `window` behind it.

    [S], [N] -> [S, N] bool
    """
    behind = q_positions[:, None] - key_positions[None, :]  # [S, N]
    seen = behind >= 0
    return seen if window is None else seen & (behind < window)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None, window: int | None = None
) -> torch.Tensor:
    """Every token of a contiguous run from position 0 attends to itself and all before it (or its window).

    q: [T, H, D]; k, v: [T, H_kv, D] -> [T, H * D]
    """
    num_tokens = q.shape[0]
    mask = None
    if window is not None and window < num_tokens:
        positions = torch.arange(num_tokens, device=q.device)
        mask = visible_keys(positions, positions, window)  # [T, T]
    return masked_attention(q, k, v, mask, scale)


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None = None
) -> torch.Tensor:
    """Each query attends to the keys its row of `mask` allows (causal order when mask is None).

    q: [S, H, D]; k, v: [N, H_kv, D]; mask: [S, N] bool -> [S, H * D]
    """
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True,
    )  # [1, H, S, D]
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


def positional_attention(
    q: torch.Tensor,
    q_positions: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Queries at arbitrary ascending positions attend to the keys at positions <= their own (within a window).

    Keys sit at positions 0..N-1 (their index). q: [S, H, D]; q_positions: [S] ascending; k, v: [N, H_kv, D]
    -> [S, H * D]
    """
    num_queries = q.shape[0]
    if num_queries <= MAX_SHORT_QUERIES:
        return short_query_attention(q, q_positions, k, v, scale, window)
    outputs = []
    for group in torch.arange(num_queries).tensor_split(min(NUM_QUERY_GROUPS, num_queries)):
        positions = q_positions[group].to(q.device)
        end = int(positions[-1]) + 1
        start = 0 if window is None else max(0, int(positions[0]) - window + 1)  # keys no query here sees
        mask = visible_keys(positions, torch.arange(start, end, device=q.device), window)  # [S_g, K_g]
        out = F.scaled_dot_product_attention(
            q[group].transpose(0, 1)[None],
            k[start:end].transpose(0, 1)[None],
            v[start:end].transpose(0, 1)[None],
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )  # [1, H, S_g, D]
        outputs.append(out[0].transpose(0, 1).reshape(len(group), -1))
    return torch.cat(outputs)


def short_query_attention(
    q: torch.Tensor,
    q_positions: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """A few queries over many keys as two batched matmuls per KV head (softmax in float32).

    q: [S, H, D]; q_positions: [S]; k, v: [N, H_kv, D] at positions 0..N-1 -> [S, H * D]
    """
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    q_grouped = q.reshape(num_queries, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [H_kv, G, S, D]
    q_grouped = q_grouped.reshape(num_kv_heads, group * num_queries, head_dim)
    scores = torch.bmm(q_grouped, k.permute(1, 2, 0)).float() * scale  # [H_kv, G*S, N]
    seen = visible_keys(q_positions.to(q.device), torch.arange(k.shape[0], device=q.device), window)  # [S, N]
    scores = scores.masked_fill(~seen.repeat(group, 1)[None], float("-inf"))
    out = torch.bmm(scores.softmax(-1).to(v.dtype), v.transpose(0, 1))  # [H_kv, G*S, D]
    out = out.reshape(num_kv_heads, group, num_queries, head_dim).permute(2, 0, 1, 3)  # [S, H_kv, G, D]
    return out.reshape(num_queries, num_heads * head_dim)
