"""CacheBlend (Yao et al., EuroSys'25): recompute the tokens whose KV deviates most, found by gradual filtering."""
import torch

from workers.fusion.base import FusionMode, all_positions
from workers.fusion.deviation import keep_top, kv_deviation, ratio_count
from workers.fusion.layout import BlendLayout
from workers.fusion.selective_pass import LayerStep


class CacheBlend(FusionMode):
    """Layer 0 in full; at each filter layer rank the still-recomputed tokens by KV deviation and keep the top."""

    name = "cacheblend"

    def initial(self, layout: BlendLayout, ratio: float) -> torch.Tensor:
        return all_positions(layout)

    def narrow(self, step: LayerStep, ratio: float) -> torch.Tensor | None:
        opts = self.options
        if step.layer not in opts.filter_layers:
            return None
        multiplier = opts.filter_multipliers[opts.filter_layers.index(step.layer)]
        num_reusable = int((~step.layout.forced).sum())
        deviation = step_deviation(step, opts.deviation_metric)
        return keep_top(deviation, step.layout.forced[step.positions], ratio_count(min(1.0, ratio * multiplier), num_reusable))


def step_deviation(step: LayerStep, metric: str) -> torch.Tensor:
    """Deviation of the step's fresh K/V from the cached K/V at the same positions. # [S]"""
    cached_k, cached_v = step.cache.data[step.layer, 0, step.positions], step.cache.data[step.layer, 1, step.positions]
    return kv_deviation(step.k, step.v, cached_k, cached_v, metric)
