"""Where Cache-Craft's recompute budget goes: inside each chunk, or pooled across the chunks where the question reads.

Cache-Craft sets each chunk's share to recompute from its context impact (cachecraft.chunk_share). A placement
turns those shares and a token score into the positions kept:

- `per_chunk` (the paper's): every chunk recomputes its own share, its best-scoring tokens;
- `pooled`: chunks with a share of 1 are kept whole, chunks with none are left out, and the partial chunks'
  summed budget goes to their best-scoring spans wherever they are, as query_driven spends its budget.
"""
from collections.abc import Callable

import torch

from workers.fusion.deviation import keep_top_spans, ratio_count
from workers.fusion.layout import Segment

Placement = Callable[[torch.Tensor, list[Segment], list[float], int], torch.Tensor]


def place_per_chunk(scores: torch.Tensor, chunks: list[Segment], shares: list[float], span_tokens: int) -> torch.Tensor:
    """Each chunk's share of its own best-scoring spans. scores: [N] -> [N] bool"""
    keep = torch.zeros(scores.shape[0], dtype=torch.bool)
    positions = torch.arange(scores.shape[0])
    for seg, share in zip(chunks, shares):
        part = slice(seg.start, min(seg.end, scores.shape[0]))
        if share == 0.0 or part.stop <= part.start:
            continue
        none_forced = torch.zeros(part.stop - part.start, dtype=torch.bool)
        count = ratio_count(share, part.stop - part.start)
        keep[seg.start + keep_top_spans(scores[part], none_forced, count, positions[part], span_tokens)] = True
    return keep


def place_pooled(scores: torch.Tensor, chunks: list[Segment], shares: list[float], span_tokens: int) -> torch.Tensor:
    """Chunks at share 1 whole; the partial chunks' summed budget on their best spans. scores: [N] -> [N] bool"""
    keep = torch.zeros(scores.shape[0], dtype=torch.bool)
    open_ = torch.zeros(scores.shape[0], dtype=torch.bool)  # positions of chunks recomputed in part
    budget = 0
    for seg, share in zip(chunks, shares):
        part = slice(seg.start, min(seg.end, scores.shape[0]))
        if share >= 1.0:
            keep[part] = True
        elif share > 0.0 and part.stop > part.start:
            open_[part] = True
            budget += ratio_count(share, part.stop - part.start)
    if budget:
        chosen = torch.zeros_like(keep)
        chosen[keep_top_spans(scores, ~open_, budget, torch.arange(scores.shape[0]), span_tokens)] = True
        keep |= chosen & open_  # a span reaching into a chunk left out or kept whole adds nothing there
    return keep


PLACEMENTS: dict[str, Placement] = {"per_chunk": place_per_chunk, "pooled": place_pooled}
