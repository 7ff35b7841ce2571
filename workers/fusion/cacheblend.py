"""CacheBlend (Yao et al., EuroSys'25): recompute the tokens whose KV deviates most, found by gradual filtering."""
import logging
from dataclasses import dataclass

import torch

from workers.fusion.base import FusionMode, inexact_positions
from workers.fusion.deviation import keep_top_spans, kv_deviation, ratio_count
from workers.fusion.layer_feed import LayerFeed
from workers.fusion.layout import BlendLayout
from workers.fusion.selective_pass import LayerStep, PrefillResult, selective_prefill
from workers.fusion.sparsity import coverage, escalated_ratio
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class _RequestRatio:
    """The ratio one request runs at (the check layer may raise it) and how concentrated its deviation was there."""

    recompute_ratio: float
    coverage: float | None = None


class CacheBlend(FusionMode):
    """Layer 0 in full but for the exact leading run; at each filter layer rank the still-recomputed tokens by KV
    deviation and keep the top.

    At the first filter layer (the check layer) a request whose deviation is not concentrated enough for
    the recompute_ratio (FusionOptions.fallback.min_coverage) runs at a higher recompute_ratio, or in full.
    """

    name = "cacheblend"

    def prefill(
        self,
        runner: ModelRunner,
        layout: BlendLayout,
        cache: KVCache,
        recompute_ratio: float,
        feed: LayerFeed | None = None,
    ) -> PrefillResult:
        """The selective pass at this request's ratio, reported in the result when the check layer raised it."""
        if feed is None:
            layout.load_cached(cache, runner.rerotate_keys)
        state = _RequestRatio(recompute_ratio)
        result = selective_prefill(
            runner, layout, cache, self.initial(layout, recompute_ratio), lambda step: self._narrow(step, state), feed
        )
        result.recompute_ratio = state.recompute_ratio
        result.check_coverage = state.coverage
        return result

    def initial(self, layout: BlendLayout, recompute_ratio: float) -> torch.Tensor:
        return inexact_positions(layout)

    def narrow(self, step: LayerStep, recompute_ratio: float) -> torch.Tensor | None:
        return self._narrow(step, _RequestRatio(recompute_ratio))

    def _narrow(self, step: LayerStep, state: _RequestRatio) -> torch.Tensor | None:
        opts = self.options
        if step.layer not in opts.filter_layers:
            return None
        multiplier = opts.filter_multipliers[opts.filter_layers.index(step.layer)]
        forced = step.layout.forced[step.positions]
        budget = step.layout.budget_mask()
        in_budget = budget[step.positions]
        num_reusable = int(budget.sum())
        deviation = step_deviation(step, opts.deviation_metric)
        if step.layer == opts.filter_layers[0]:
            # A chunk in the exact run the pass skipped deviates by nothing: counted, so the coverage is of every
            # chunk token, wherever the exact run ends.
            skipped = deviation.new_zeros(num_reusable - int(in_budget.sum()))
            reusable = torch.cat([deviation[in_budget], skipped])
            state.coverage = coverage(
                reusable, ratio_count(min(1.0, state.recompute_ratio * multiplier), reusable.numel())
            )
            raised = escalated_ratio(
                reusable, state.recompute_ratio, multiplier, opts.fallback.min_coverage, opts.fallback.full_above
            )
            if raised > state.recompute_ratio:
                _log.info(
                    "cacheblend: deviation not sparse at layer %d; recompute_ratio %.2f -> %.2f",
                    step.layer,
                    state.recompute_ratio,
                    raised,
                )
                state.recompute_ratio = raised
        num_keep = ratio_count(min(1.0, state.recompute_ratio * multiplier), num_reusable)
        return keep_top_spans(self.ranking(step, deviation), forced, num_keep, step.positions,
                              opts.selection_span_tokens)

    def ranking(self, step: LayerStep, deviation: torch.Tensor) -> torch.Tensor:
        """The scores the budget is spent by: the deviation itself. # [S]"""
        return deviation


def step_deviation(step: LayerStep, metric: str) -> torch.Tensor:
    """Deviation of the step's fresh K/V from the cached K/V at the same positions. # [S]"""
    cached_k, cached_v = step.cache.data[step.layer, 0, step.positions], step.cache.data[step.layer, 1, step.positions]
    return kv_deviation(step.k, step.v, cached_k, cached_v, metric).to(step.positions.device)  # selection runs on CPU
