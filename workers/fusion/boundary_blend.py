"""CacheBlend that spends its budget first on every chunk's opening span, then by KV deviation.

A chunk's cached KV was computed without the chunks before it. Where a fact runs across a chunk boundary (a
sentence cut by a fixed-size chunker: "... the code for X is:" | "4712193."), the tokens that open the next
chunk are the ones whose KV lacks what they continue, and their deviation at the check layer need not rank
them high (on the task suite's split facts cacheblend at r = 0.15 lost most of them while EPIC, which
recomputes each chunk's first tokens, kept them: docs/quality.md). Same budget as cacheblend's.
"""
import torch

from workers.fusion.cacheblend import CacheBlend
from workers.fusion.selective_pass import LayerStep


class BoundaryBlend(CacheBlend):
    """cacheblend with the first `selection_span_tokens` of each inexact chunk ranked above every other span."""

    name = "cacheblend_boundary"

    def ranking(self, step: LayerStep, deviation: torch.Tensor) -> torch.Tensor:
        openings = chunk_openings(step, self.options.selection_span_tokens)  # [S]
        boost = deviation.float().abs().sum() + 1.0  # above any sum of unboosted deviations
        return deviation.float() + openings * boost


def chunk_openings(step: LayerStep, span_tokens: int) -> torch.Tensor:
    """Weights of the first `span_tokens` positions of each chunk whose cached KV is not exact. # [S]

    The weight falls from `span_tokens` at a chunk's first token to 1, so of the (at most two) aligned spans the
    opening overlaps, the one holding the chunk's first tokens ranks first.
    """
    weights = torch.zeros(step.layout.kv_end)
    for start, end in step.layout.inexact_openings(span_tokens):
        weights[start:end] = torch.arange(span_tokens, span_tokens - (end - start), -1).float()
    return weights[step.positions.cpu()]
