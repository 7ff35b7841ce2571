"""query_boundary: the question's attention on a chunk's tail also ranks the next chunk's opening."""
import torch

from tests.workers.fusion.test_boundary_blend import _layout
from workers.fusion.base import FusionOptions
from workers.fusion.layout import BlendLayout
from workers.fusion.query_boundary import QueryBoundary, boundary_guard, carry_across_boundaries
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


def test_the_last_tokens_before_an_inexact_chunk_are_never_recomputed() -> None:
    # both chunks inexact (computed after another prefix): chunk B's guard, 36-40, sits in chunk A
    base = _layout()
    layout = BlendLayout(base.token_ids, base.segments, base.kv_end, chunks_follow_prefix=False)
    relevance = torch.zeros(80)
    relevance[32:48] = 1.0  # the aligned span 32-48 straddles the A | B boundary at 40
    options = FusionOptions(selection_span_tokens=16)
    ratio = 12 / 72  # 12 of the 72 reused tokens: the span 32-48 less its guard
    forced = layout.forced.nonzero().squeeze(1).tolist()
    chosen = QueryBoundary(options).choose(layout, relevance, ratio).tolist()
    assert chosen == list(range(32, 36)) + list(range(40, 48)) + forced
    unguarded = QueryBoundary(options, guard_tokens=0).choose(layout, relevance, ratio).tolist()
    assert unguarded == list(range(32, 48)) + forced
    assert boundary_guard(layout, 16, 4).nonzero().squeeze(1).tolist() == [4, 5, 6, 7, 36, 37, 38, 39]
