"""bench/tail_rules.py's placements on a small layout: the oracle keeps the needle's chunk, the shares parse."""
import torch

from bench.tail_rules import Placement, _shares
from tests.workers.fusion.test_boundary_blend import _layout
from workers.fusion.base import FusionOptions
from workers.fusion.layout import BlendLayout


def _inexact_layout() -> BlendLayout:
    # prefix 0-8, chunks A 8-40 and B 40-72 computed after another prefix (both inexact), question 72-80
    base = _layout()
    return BlendLayout(base.token_ids, base.segments, base.kv_end, chunks_follow_prefix=False)


def test_rule_names_give_their_shares() -> None:
    assert _shares("tail") == (0.0, 1.0, False) and _shares("tail0.25") == (0.25, 1.0, False)
    assert _shares("mix0.25_0.5") == (0.25, 0.5, False) and _shares("mix0.25_0_skip") == (0.25, 0.0, True)


def test_the_needle_oracle_recomputes_its_chunk_and_the_tail_rule_the_context_end() -> None:
    layout = _inexact_layout()  # chunks A 8-40 and B 40-72, both inexact; guard 4-7 and 36-39
    forced = layout.forced.nonzero().squeeze(1).tolist()
    whole = Placement(FusionOptions(selection_span_tokens=8), "needle_whole")
    whole.needle = 0
    assert whole.choose(layout, torch.zeros(80), 0.5).tolist() == list(range(8, 36)) + forced
    tail = Placement(FusionOptions(selection_span_tokens=8), "tail").choose(layout, torch.zeros(80), 0.1)
    assert tail.tolist() == list(range(64, 72)) + forced  # 0.1 x 72 reused tokens -> 8, the last ones


def test_openings_then_tail_then_the_best_read_span() -> None:
    layout = _inexact_layout()
    relevance = torch.zeros(80)
    relevance[16:24] = 1.0  # the question reads inside chunk A
    forced = layout.forced.nonzero().squeeze(1).tolist()
    # r = 0.25 of 72 reused tokens: 18. Openings: 0.0625 x 32 -> 2 a chunk; tail: half of the 14 left, 7;
    # the other 7 from the best-read aligned span of 8 (16-24), which may overshoot by one.
    mixed = Placement(FusionOptions(selection_span_tokens=8), "mix0.25_0.5")
    assert mixed.choose(layout, relevance, 0.25).tolist() == [8, 9, *range(16, 24), 40, 41, *range(65, 72), *forced]
