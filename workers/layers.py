"""The transformer math as plain functions: RMSNorm, attention with position masks, gated MLP."""
import torch
import torch.nn.functional as F

# Sparse queries are split into this many position-sorted groups, so each group attends only to
# keys up to its last position: ~1.3x less attention work than one masked call over all keys.
NUM_QUERY_GROUPS = 4


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
    outputs = []
    for group in torch.arange(num_queries).tensor_split(min(NUM_QUERY_GROUPS, num_queries)):
        positions = q_positions[group]
        num_keys = int(positions[-1]) + 1
        mask = torch.arange(num_keys)[None, :] <= positions[:, None]  # [S_g, K_g]
        out = F.scaled_dot_product_attention(
            q[group].transpose(0, 1)[None],
            k[:num_keys].transpose(0, 1)[None],
            v[:num_keys].transpose(0, 1)[None],
            attn_mask=mask,
            enable_gqa=True,
        )  # [1, H, S_g, D]
        outputs.append(out[0].transpose(0, 1).reshape(len(group), -1))
    return torch.cat(outputs)
