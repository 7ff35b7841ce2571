"""query_boundary: the question's attention on a chunk's tail also ranks the next chunk's opening."""
import torch

from tests.workers.fusion.test_boundary_blend import _layout
from workers.fusion.base import FusionOptions
from workers.fusion.query_boundary import QueryBoundary, carry_across_boundaries
from workers.fusion.query_driven import QueryDriven
from workers.fusion.registry import FUSION_MODES


def _relevance(tail_of_a: float) -> torch.Tensor:
    relevance = torch.zeros(80)
    relevance[24:40] = tail_of_a  # chunk A's last span: where a cut fact's key would sit
    relevance[40:42] = 0.5  # chunk B's first tokens, barely read
    relevance[64:72] = 1.0  # chunk B's tail
    return relevance


def test_the_tail_relevance_is_spread_over_the_next_inexact_chunks_opening_only() -> None:
    layout = _layout()  # prefix 0-8 and chunk A 8-40 exact, chunk B 40-72 inexact, question 72-80
    scores = carry_across_boundaries(layout, _relevance(2.0), span_tokens=16)
    assert torch.equal(scores[40:42], torch.full((2,), 2.5)) and torch.equal(scores[42:56], torch.full((14,), 2.0))
    assert torch.equal(scores[56:], _relevance(2.0)[56:]) and torch.equal(scores[:40], _relevance(2.0)[:40])


def test_a_chunks_opening_is_recomputed_when_the_question_reads_the_chunk_before_it() -> None:
    layout = _layout()
    options = FusionOptions(selection_span_tokens=16)
    forced = layout.forced.nonzero().squeeze(1).tolist()
    ratio = 0.1  # 8 of the 72 reused tokens: one aligned span's worth of chunk B
    read = _relevance(2.0)
    assert QueryDriven(options).choose(layout, read, ratio).tolist() == list(range(64, 72)) + forced
    assert QueryBoundary(options).choose(layout, read, ratio).tolist() == list(range(40, 48)) + forced
    unread = _relevance(0.0)
    assert QueryBoundary(options).choose(layout, unread, ratio).tolist() == list(range(64, 72)) + forced
    assert FUSION_MODES["query_boundary"] is QueryBoundary
