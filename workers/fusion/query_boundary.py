"""query_driven that credits the question's attention on a chunk's last tokens to the next chunk's first ones.

A fact cut by chunking ("... the code for X is:" | "4712193.") is read by the question at the key, the end of
one chunk, while the value opens the next chunk, whose cached KV never saw the key: the value needs
recomputing, but the question's attention on the cached context often ranks it low. So before the budget is
spent, each inexact chunk's first `selection_span_tokens` tokens receive, spread evenly, the relevance of the
span of tokens just before the chunk. Where the question reads nothing across a boundary the ranking is
query_driven's; the budget is the same.

The last GUARD_TOKENS tokens before each inexact chunk are never recomputed: measured on split_fact (SmolLM2,
docs/quality.md), recomputing a cut value together with its key's last tokens loses the answer that recomputing
the value alone keeps, and the aligned spans the budget is spent in often hold both.
"""
import torch

from workers.fusion.base import FusionOptions
from workers.fusion.layout import BlendLayout
from workers.fusion.query_driven import QueryDriven, QueryScoring, select_tokens

GUARD_TOKENS = 4


class QueryBoundary(QueryDriven):
    """query_driven with each chunk's opening ranked by the attention the question pays the chunk before it."""

    name = "query_boundary"

    def __init__(
        self, options: FusionOptions, scoring: QueryScoring | None = None, guard_tokens: int = GUARD_TOKENS
    ) -> None:
        super().__init__(options, scoring)
        if guard_tokens < 0:
            raise ValueError(f"guard_tokens must be >= 0, got {guard_tokens}")
        self.guard_tokens = guard_tokens

    def ranking(self, layout: BlendLayout, relevance: torch.Tensor) -> torch.Tensor:
        """The question's attention, carried across chunk boundaries. # [kv_end] -> [kv_end]"""
        return carry_across_boundaries(layout, relevance, self.options.selection_span_tokens)

    def choose(self, layout: BlendLayout, relevance: torch.Tensor, recompute_ratio: float) -> torch.Tensor:
        """query_driven's choice over the carried ranking, the guard before each inexact chunk left out. # [K]"""
        span_tokens = self.options.selection_span_tokens
        guard = boundary_guard(layout, span_tokens, self.guard_tokens)
        scores = self.ranking(layout, relevance)
        return select_tokens(scores, layout, recompute_ratio, span_tokens, self.scoring.budget_split, guard)


def carry_across_boundaries(layout: BlendLayout, relevance: torch.Tensor, span_tokens: int) -> torch.Tensor:
    """relevance plus, on each inexact chunk's first span_tokens tokens, the relevance of the span_tokens before it.

    relevance: [kv_end] -> [kv_end] float32
    """
    scores = relevance.float().clone()
    for start, end in layout.inexact_openings(span_tokens):
        carried = float(relevance[max(0, start - span_tokens) : start].sum())
        scores[start:end] += carried / (end - start)
    return scores


def boundary_guard(layout: BlendLayout, span_tokens: int, guard_tokens: int) -> torch.Tensor:
    """The guard_tokens positions just before each inexact chunk. # -> [kv_end] bool"""
    guard = torch.zeros(layout.kv_end, dtype=torch.bool)
    for start, _ in layout.inexact_openings(span_tokens):
        guard[max(0, start - guard_tokens) : start] = True
    return guard
