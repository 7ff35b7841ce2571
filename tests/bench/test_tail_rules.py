"""bench/tail_rules.py's placements on a small layout: the oracle keeps the needle's chunk, the shares parse."""
import torch

from bench.tail_rules import Placement, _shares
from tests.workers.fusion.test_query_tail import _inexact_layout
from workers.fusion.base import FusionOptions


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
