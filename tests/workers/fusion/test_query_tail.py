"""query_tail: the budget spent on inexact chunks' openings, then the context's tail, then the question's reading."""
import torch

from tests.workers.fusion.test_boundary_blend import _layout
from workers.fusion.base import FusionOptions
from workers.fusion.layout import BlendLayout
from workers.fusion.query_boundary import boundary_guard
from workers.fusion.query_tail import QueryTail, anchored_choice
from workers.fusion.registry import FUSION_MODES


def _inexact_layout() -> BlendLayout:
    # prefix 0-8, chunks A 8-40 and B 40-72 computed after another prefix (both inexact), question 72-80
    base = _layout()
    return BlendLayout(base.token_ids, base.segments, base.kv_end, chunks_follow_prefix=False)


def test_openings_then_tail_then_the_best_read_span() -> None:
    layout = _inexact_layout()
    relevance = torch.zeros(80)
    relevance[16:24] = 1.0  # the question reads inside chunk A
    forced = layout.forced.nonzero().squeeze(1).tolist()
    # r = 0.25 of 72 reused tokens: 18. Openings: 0.0625 x 32 -> 2 a chunk; tail: half of the 14 left, 7;
    # the other 7 from the best-read aligned span of 8 (16-24), which may overshoot by one.
    chosen = QueryTail(FusionOptions(selection_span_tokens=8)).choose(layout, relevance, 0.25).tolist()
    assert chosen == [8, 9, *range(16, 24), 40, 41, *range(65, 72), *forced]


def test_the_guard_and_the_exact_leading_chunk_are_never_spent_on() -> None:
    layout = _layout()  # chunk A 8-40 sits where it was computed: exact, so neither its opening nor its tokens
    guard = boundary_guard(layout, 16, 4)  # 36-39, before chunk B
    scores = torch.zeros(80)
    scores[32:40] = 5.0  # the best-read tokens are in the exact chunk and the guard
    chosen = anchored_choice(layout, scores, 0.5, 16, guard, opening_share=0.25, tail_share=0.5)
    kept = set(chosen.tolist()) - set(layout.forced.nonzero().squeeze(1).tolist())
    assert kept and min(kept) >= 40  # all in chunk B
    assert set(range(40, 45)) <= kept  # its opening: 0.125 x 32 -> 4 tokens, plus the tail's and ranking's share
    assert kept == set(range(40, 72))  # the budget, 0.5 of 72 reused tokens, is over chunk B's 32: all of them


def test_no_budget_is_the_forced_tokens_only() -> None:
    layout = _inexact_layout()
    chosen = QueryTail(FusionOptions()).choose(layout, torch.zeros(80), 0.0)
    assert torch.equal(chosen, layout.forced.nonzero().squeeze(1))
    assert FUSION_MODES["query_tail"] is QueryTail
