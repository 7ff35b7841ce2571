"""Baseline: compute the whole prompt from scratch, ignoring every cache."""
import torch

from workers.fusion.base import FusionMode, all_positions
from workers.fusion.layout import BlendLayout


class FullPrefill(FusionMode):
    """Reference output: plain causal prefill of the exact same token ids."""

    name = "full_prefill"
    reads_chunk_cache = False

    def initial(self, layout: BlendLayout, ratio: float) -> torch.Tensor:
        return all_positions(layout)
