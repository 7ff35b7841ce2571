"""The transformer math as plain functions: RMSNorm, attention with position masks, gated MLP."""
import torch
import torch.nn.functional as F

# Sparse queries are split into this many position-sorted groups, so each group attends only to
# keys up to its last position: ~1.3x less attention work than one masked call over all keys.
NUM_QUERY_GROUPS = 4
# Up to this many queries (decode steps, short suffixes) plain batched matmuls beat the CPU flash kernel ~8x:
# the kernel parallelises over query blocks, and a handful of queries fills only one.
MAX_SHORT_QUERIES = 64


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm computed in float32, returned in x's dtype. x: [S, hidden]"""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP. x: [S, hidden]; gate_up: [2I, hidden]; down: [hidden, I]."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Every token of a contiguous run from position 0 attends to itself and all before it.

    q: [T, H, D]; k, v: [T, H_kv, D] -> [T, H * D]
    """
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], is_causal=True, enable_gqa=True
    )  # [1, H, T, D]
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


def positional_attention(q: torch.Tensor, q_positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Queries at arbitrary ascending positions attend to the keys at positions <= their own.

    Keys sit at positions 0..N-1 (their index). q: [S, H, D]; q_positions: [S] ascending; k, v: [N, H_kv, D]
    -> [S, H * D]
    """
    num_queries = q.shape[0]
    if num_queries <= MAX_SHORT_QUERIES:
        return short_query_attention(q, q_positions, k, v)
    outputs = []
    for group in torch.arange(num_queries).tensor_split(min(NUM_QUERY_GROUPS, num_queries)):
        positions = q_positions[group]
        num_keys = int(positions[-1]) + 1
        mask = torch.arange(num_keys, device=q.device)[None, :] <= positions.to(q.device)[:, None]  # [S_g, K_g]
        out = F.scaled_dot_product_attention(
            q[group].transpose(0, 1)[None],
            k[:num_keys].transpose(0, 1)[None],
            v[:num_keys].transpose(0, 1)[None],
            attn_mask=mask,
            enable_gqa=True,
        )  # [1, H, S_g, D]
        outputs.append(out[0].transpose(0, 1).reshape(len(group), -1))
    return torch.cat(outputs)


def short_query_attention(q: torch.Tensor, q_positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A few queries over many keys as two batched matmuls per KV head (softmax in float32).

    q: [S, H, D]; q_positions: [S]; k, v: [N, H_kv, D] at positions 0..N-1 -> [S, H * D]
    """
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    q_grouped = q.reshape(num_queries, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [H_kv, G, S, D]
    q_grouped = q_grouped.reshape(num_kv_heads, group * num_queries, head_dim)
    scores = torch.bmm(q_grouped, k.permute(1, 2, 0)).float() / head_dim**0.5  # [H_kv, G*S, N]
    hidden = torch.arange(k.shape[0], device=q.device)[None, :] > q_positions.to(q.device)[:, None]  # [S, N]
    scores = scores.masked_fill(hidden.repeat(group, 1)[None], float("-inf"))
    out = torch.bmm(scores.softmax(-1).to(v.dtype), v.transpose(0, 1))  # [H_kv, G*S, D]
    out = out.reshape(num_kv_heads, group, num_queries, head_dim).permute(2, 0, 1, 3)  # [S, H_kv, G, D]
    return out.reshape(num_queries, num_heads * head_dim)
