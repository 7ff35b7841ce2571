"""Baseline: compute the whole prompt from scratch, ignoring every cache."""
from workers.fusion.base import FusionMode


class FullPrefill(FusionMode):
    """Reference output: plain causal prefill of the exact same token ids."""

    name = "full_prefill"
    reads_chunk_cache = False
