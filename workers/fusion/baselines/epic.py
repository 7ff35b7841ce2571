"""Baseline (EPIC, ICML'25): recompute the first k tokens of every chunk, where attention sinks form."""
import torch

from workers.fusion.base import FusionMode
from workers.fusion.deviation import ratio_count
from workers.fusion.layout import BlendLayout


class Epic(FusionMode):
    """Static position-based selection: k = options.epic_tokens, or recompute_ratio x chunk length when unset."""

    name = "epic"

    def initial(self, layout: BlendLayout, recompute_ratio: float) -> torch.Tensor:
        selected = layout.forced.clone()
        for seg in layout.chunk_segments():
            k = (
                self.options.epic_tokens
                if self.options.epic_tokens is not None
                else ratio_count(recompute_ratio, seg.num_tokens)
            )
            selected[seg.start : seg.start + min(k, seg.num_tokens)] = True
        return selected.nonzero().squeeze(1)
