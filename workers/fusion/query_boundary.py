"""query_driven that credits the question's attention on a chunk's last tokens to the next chunk's first ones.

A fact cut by chunking ("... the code for X is:" | "4712193.") is read by the question at the key, the end of
one chunk, while the value opens the next chunk, whose cached KV never saw the key: the value needs
recomputing, but the question's attention on the cached context often ranks it low. So before the budget is
spent, each inexact chunk's first `selection_span_tokens` tokens receive, spread evenly, the relevance of the
span of tokens just before the chunk. Where the question reads nothing across a boundary the ranking is
query_driven's; the budget is the same.
"""
import torch

from workers.fusion.layout import BlendLayout
from workers.fusion.query_driven import QueryDriven


class QueryBoundary(QueryDriven):
    """query_driven with each chunk's opening ranked by the attention the question pays the chunk before it."""

    name = "query_boundary"

    def ranking(self, layout: BlendLayout, relevance: torch.Tensor) -> torch.Tensor:
        """The question's attention, carried across chunk boundaries. # [kv_end] -> [kv_end]"""
        return carry_across_boundaries(layout, relevance, self.options.selection_span_tokens)


def carry_across_boundaries(layout: BlendLayout, relevance: torch.Tensor, span_tokens: int) -> torch.Tensor:
    """relevance plus, on each inexact chunk's first span_tokens tokens, the relevance of the span_tokens before it.

    relevance: [kv_end] -> [kv_end] float32
    """
    scores = relevance.float().clone()
    for start, end in layout.inexact_openings(span_tokens):
        carried = float(relevance[max(0, start - span_tokens) : start].sum())
        scores[start:end] += carried / (end - start)
    return scores
