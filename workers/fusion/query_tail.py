"""query_boundary's budget split three ways: chunk openings, the context's tail, then the question's reading.

Measured on the fact-finding tasks (docs/quality.md), each share rescues one kind of loss:
- a chunk's opening (EPIC's positions): where a fact cut by chunking continues, whose cached KV never saw
  the text before it (split_fact);
- the context's tail, the tokens just before the question: with many chunks, recomputing the last ones lets
  the question find a needle whose own KV stays cached, where recomputing the needle itself loses it
  (single_fact at 20 chunks);
- the rest by the question's attention, carried across boundaries as query_boundary ranks it: the sentences
  among look-alike distractors (multi_key).
The guard before each inexact chunk and the scout are query_boundary's.
"""
import torch

from workers.fusion.base import FusionOptions
from workers.fusion.deviation import keep_top_spans, ratio_count
from workers.fusion.layout import BlendLayout
from workers.fusion.query_boundary import QueryBoundary, boundary_guard
from workers.fusion.query_driven import QueryScoring, selectable_mask

OPENING_SHARE = 0.25  # of the budget, spread over the inexact chunks by their length
TAIL_SHARE = 0.5  # of what the openings leave


class QueryTail(QueryBoundary):
    """Each inexact chunk's opening, the context's tail, then the question's carried attention."""

    name = "query_tail"

    def __init__(
        self,
        options: FusionOptions,
        scoring: QueryScoring | None = None,
        opening_share: float = OPENING_SHARE,
        tail_share: float = TAIL_SHARE,
    ) -> None:
        super().__init__(options, scoring)
        if not (0.0 <= opening_share <= 1.0 and 0.0 <= tail_share <= 1.0):
            raise ValueError(f"shares must be in [0, 1], got {opening_share}, {tail_share}")
        self.opening_share = opening_share
        self.tail_share = tail_share

    def choose(self, layout: BlendLayout, relevance: torch.Tensor, recompute_ratio: float) -> torch.Tensor:
        """The budget spent on openings, tail and ranking in that order. # [K] ascending"""
        span_tokens = self.options.selection_span_tokens
        guard = boundary_guard(layout, span_tokens, self.guard_tokens)
        scores = self.ranking(layout, relevance)
        return anchored_choice(
            layout, scores, recompute_ratio, span_tokens, guard, self.opening_share, self.tail_share
        )


def anchored_choice(
    layout: BlendLayout,
    scores: torch.Tensor,
    recompute_ratio: float,
    span_tokens: int,
    excluded: torch.Tensor,
    opening_share: float,
    tail_share: float,
) -> torch.Tensor:
    """Forced positions plus ratio x the reused tokens: openings, then the tail, then the best-scoring spans.

    The budget counts every reused token and is spent on selectable ones only, never on `excluded`.
    scores: [kv_end], excluded: [kv_end] bool -> [K] ascending
    """
    free = selectable_mask(layout) & ~excluded
    budget = min(ratio_count(recompute_ratio, int((~layout.forced).sum())), int(free.sum()))
    keep = torch.zeros(layout.kv_end, dtype=torch.bool)
    exact_end = layout.exact_end()
    for seg in layout.chunk_segments():
        if seg.start >= exact_end:
            opening = ratio_count(recompute_ratio * opening_share, seg.num_tokens)
            keep[seg.start : min(seg.start + opening, layout.kv_end)] = True
    keep &= free
    tail = int((budget - int(keep.sum())) * tail_share)
    if tail > 0:
        keep[(free & ~keep).nonzero().squeeze(1)[-tail:]] = True
    rest = budget - int(keep.sum())
    if rest > 0:
        blocked = ~free | keep
        ranked = scores.float().masked_fill(blocked, 0.0)
        keep[keep_top_spans(ranked, blocked, rest, torch.arange(layout.kv_end), span_tokens)] = True
    return ((keep & free) | layout.forced).nonzero().squeeze(1)
