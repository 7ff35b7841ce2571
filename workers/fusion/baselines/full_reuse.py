"""Baseline (PromptCache style): every cached chunk reused as is, positions recovered, nothing recomputed."""
import torch

from workers.fusion.base import FusionMode
from workers.fusion.layout import BlendLayout


class FullReuse(FusionMode):
    """Recompute only what has no cache: the suffix and uncached chunks."""

    name = "full_reuse"

    def initial(self, layout: BlendLayout, recompute_ratio: float) -> torch.Tensor:
        return layout.forced.nonzero().squeeze(1)
