"""Where Cache-Craft's per-chunk shares go: inside each chunk, or pooled where the scores are highest."""
import pytest
import torch

from workers.fusion.base import CraftOptions
from workers.fusion.craft_placement import place_per_chunk, place_pooled
from workers.fusion.layout import CHUNK, Segment

CHUNKS = [Segment(2, 10, CHUNK), Segment(10, 18, CHUNK), Segment(18, 26, CHUNK)]


def _scores() -> torch.Tensor:
    """The second chunk scores highest throughout, the third lowest. # [28]"""
    scores = torch.zeros(28)
    scores[2:10] = torch.arange(8, dtype=torch.float32) + 10.0
    scores[10:18] = torch.arange(8, dtype=torch.float32) + 100.0
    scores[18:26] = torch.arange(8, dtype=torch.float32)
    return scores


def test_per_chunk_keeps_each_chunks_share_of_its_own_best_tokens() -> None:
    kept = place_per_chunk(_scores(), CHUNKS, [0.25, 0.25, 0.5], span_tokens=1).nonzero().squeeze(1).tolist()
    assert kept == [8, 9, 16, 17, 22, 23, 24, 25]


def test_pooled_spends_the_summed_budget_on_the_best_tokens_of_the_partial_chunks() -> None:
    kept = place_pooled(_scores(), CHUNKS, [0.25, 0.25, 0.5], span_tokens=1).nonzero().squeeze(1).tolist()
    assert kept == list(range(10, 18))  # 2 + 2 + 4 tokens, all in the chunk scoring highest


def test_pooled_keeps_full_chunks_whole_and_leaves_out_chunks_with_no_share() -> None:
    # the second chunk (the best scores) has no share, the first is recomputed whole: the third gets the budget
    kept = place_pooled(_scores(), CHUNKS, [1.0, 0.0, 0.25], span_tokens=1).nonzero().squeeze(1).tolist()
    assert kept == list(range(2, 10)) + [24, 25]
    assert not place_pooled(_scores(), CHUNKS, [0.0, 0.0, 0.0], span_tokens=1).any()


def test_pooled_spans_stop_at_the_partial_chunks() -> None:
    # spans of 4 from position 0: [8, 12) straddles the first chunk (left out) and the second (partial)
    scores = torch.zeros(28)
    scores[8:12] = 50.0
    kept = place_pooled(scores, CHUNKS, [0.0, 0.25, 0.0], span_tokens=4).nonzero().squeeze(1).tolist()
    assert kept == [10, 11]


def test_an_unknown_placement_is_refused() -> None:
    with pytest.raises(ValueError, match=r"craft\.placement"):
        CraftOptions(placement="everywhere")
