"""The attention paths agree with one another and with a plain masked softmax."""
import pytest
import torch

from workers.layers import MAX_SHORT_QUERIES, causal_attention, positional_attention


def reference_attention(q: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention written out in float64, GQA by repeating K/V heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("shd,nhd->hsn", q.double(), k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, None] > positions[None, :, None], float("-inf"))
    return torch.einsum("hsn,nhd->shd", scores.softmax(-1), v).reshape(q.shape[0], -1)


@pytest.mark.parametrize("num_queries", [1, 5, MAX_SHORT_QUERIES, MAX_SHORT_QUERIES + 37])
def test_positional_attention_matches_reference(num_queries: int) -> None:
    torch.manual_seed(num_queries)
    num_keys = 300
    q, k, v = torch.randn(num_queries, 6, 16), torch.randn(num_keys, 2, 16), torch.randn(num_keys, 2, 16)
    positions = torch.randperm(num_keys)[:num_queries].sort().values
    expected = reference_attention(q, positions, k, v).float()
    torch.testing.assert_close(positional_attention(q, positions, k, v), expected, atol=1e-5, rtol=1e-4)


def test_causal_attention_matches_reference() -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(50, 6, 16), torch.randn(50, 2, 16), torch.randn(50, 2, 16)
    expected = reference_attention(q, torch.arange(50), k, v).float()
    torch.testing.assert_close(causal_attention(q, k, v), expected, atol=1e-5, rtol=1e-4)
