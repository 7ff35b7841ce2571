"""The loading controller: recompute ratio and per-chunk tier, from a fitted delay model."""
