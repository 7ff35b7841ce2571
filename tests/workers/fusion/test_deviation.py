"""Choosing the tokens to recompute: top tokens, and top aligned spans of tokens (pure functions)."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.fusion.deviation import keep_top, keep_top_spans


def test_spans_are_chosen_by_summed_score_until_they_hold_enough_tokens() -> None:
    scores = torch.tensor([0.0, 5, 1, 0, 0, 0, 9, 0, 1, 1])
    forced = torch.zeros(10, dtype=torch.bool)
    forced[-1] = True
    positions = torch.arange(10)
    # spans of 2: [6, 7] scores 9, [0, 1] scores 5 -> two spans hold the 3 tokens asked for (one overshoot)
    assert keep_top_spans(scores, forced, 3, positions, 2).tolist() == [0, 1, 6, 7, 9]
    assert keep_top_spans(scores, forced, 4, positions, 4).tolist() == [4, 5, 6, 7, 9]
    assert keep_top_spans(scores, forced, 0, positions, 4).tolist() == [9]  # forced tokens only


def test_spans_follow_positions_not_indices() -> None:
    # a narrowed step: positions 0, 1, 8, 9, 10 with spans of 8 -> {0, 1} and {8, 9, 10}
    positions = torch.tensor([0, 1, 8, 9, 10])
    scores = torch.tensor([1.0, 1.0, 0.5, 0.5, 0.5])
    forced = torch.zeros(5, dtype=torch.bool)
    assert keep_top_spans(scores, forced, 2, positions, 8).tolist() == [0, 1]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60), st.integers(0, 70), st.integers(1, 16), st.integers(0, 2**16))
def test_spans_keep_forced_tokens_and_at_least_the_count_asked(size: int, num_keep: int, span: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(size, generator=generator)
    forced = torch.rand(size, generator=generator) < 0.2
    positions = torch.arange(size) * 2  # ascending, with gaps
    kept = keep_top_spans(scores, forced, num_keep, positions, span)
    assert kept.tolist() == sorted(set(kept.tolist()))
    assert bool(forced[kept].sum() == forced.sum())
    assert int((~forced[kept]).sum()) >= min(num_keep, int((~forced).sum()))
    if span == 1:
        assert torch.equal(kept, keep_top(scores, forced, num_keep))
