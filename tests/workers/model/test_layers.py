"""The attention paths agree with one another and with a plain masked softmax."""
import pytest
import torch

from workers.model.layers import MAX_SHORT_QUERIES, causal_attention, positional_attention


def reference_attention(
    q: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Softmax attention written out in float64, GQA by repeating K/V heads; a window keeps the last `window` keys."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("shd,nhd->hsn", q.double(), k) * (q.shape[-1] ** -0.5 if scale is None else scale)
    behind = positions[None, :, None] - torch.arange(k.shape[0])[None, None]  # [1, S, N]
    hidden = (behind < 0) | (behind >= (window or k.shape[0] + 1))
    scores = scores.masked_fill(hidden, float("-inf"))
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


@pytest.mark.parametrize("num_queries", [1, 5, MAX_SHORT_QUERIES + 37, 300])
def test_sliding_window_attention_matches_reference(num_queries: int) -> None:
    """A sliding-window layer: each query sees only the 32 keys ending at its own position, at a custom scale."""
    torch.manual_seed(num_queries)
    num_keys, window, scale = 300, 32, 0.3
    q, k, v = torch.randn(num_queries, 6, 16), torch.randn(num_keys, 2, 16), torch.randn(num_keys, 2, 16)
    positions = torch.randperm(num_keys)[:num_queries].sort().values
    expected = reference_attention(q, positions, k, v, scale, window).float()
    assert not torch.allclose(expected, reference_attention(q, positions, k, v, scale).float(), atol=1e-2)
    got = positional_attention(q, positions, k, v, scale, window)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    if num_queries == num_keys:  # every position: the causal path
        torch.testing.assert_close(causal_attention(q, k, v, scale, window), expected, atol=1e-5, rtol=1e-4)
