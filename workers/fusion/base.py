"""The fusion-mode interface and the options every mode reads."""
from abc import ABC
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from kvplane.checks import check, check_count
from workers.fusion.craft_placement import PLACEMENTS
from workers.fusion.deviation import DEVIATION_METRICS
from workers.fusion.layer_feed import LayerFeed
from workers.fusion.layout import BlendLayout
from workers.fusion.selective_pass import LayerStep, PrefillResult, selective_prefill
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner

# One check layer (the default): keep r at layer 1. Agreement as with the paper's gradual filtering (keep 2r at
# layer 1, narrow to r at layer 2) on 20 musique records, TTFT 0.06-0.1 s lower in the vLLM engine (vllm.md).
CHECK_LAYER_FILTER_LAYERS = (1,)
CHECK_LAYER_FILTER_MULTIPLIERS = (1.0,)
GRADUAL_FILTER_LAYERS = (1, 2)
GRADUAL_FILTER_MULTIPLIERS = (2.0, 1.0)


@dataclass(frozen=True, slots=True)
class CraftOptions:
    """Cache-Craft's knobs (workers/fusion/cachecraft.py): chunk context impact (CCI) and early termination."""

    cci_reuse_below: float = 0.02  # a chunk whose impact is below this is reused whole
    cci_full_above: float = 0.6  # a chunk whose impact is above this is recomputed whole
    cci_sample_queries: int = 32
    stop_after: int | None = 2  # past this layer, chunks the question barely reads are reused
    focus_below: float = 0.5  # "barely": question-attention share < this x the chunk's token share
    stored_impact: bool = True  # a chunk's stored impact sets its share before the pass
    placement: str = "per_chunk"  # where the chunks' shares go (craft_placement.PLACEMENTS)

    def __post_init__(self) -> None:
        check(
            0.0 <= self.cci_reuse_below < self.cci_full_above <= 1.0,
            "craft.cci_reuse_below, craft.cci_full_above",
            "0 <= cci_reuse_below < cci_full_above <= 1",
            (self.cci_reuse_below, self.cci_full_above),
        )
        check_count("craft.cci_sample_queries", self.cci_sample_queries, 1)
        check(self.stop_after is None or self.stop_after >= 0, "craft.stop_after", "an int >= 0 or null",
              self.stop_after)
        check(0.0 <= self.focus_below <= 1.0, "craft.focus_below", "in [0, 1]", self.focus_below)
        check(self.placement in PLACEMENTS, "craft.placement", f"one of {sorted(PLACEMENTS)}", self.placement)


@dataclass(frozen=True, slots=True)
class PrefixCacheOptions:
    """The prefix_cache baseline's block cache (workers/fusion/baselines/prefix_cache.py)."""

    num_blocks: int = 2048
    block_tokens: int = 16

    def __post_init__(self) -> None:
        check_count("prefix_cache.num_blocks", self.num_blocks, 1)
        check_count("prefix_cache.block_tokens", self.block_tokens, 1)


@dataclass(frozen=True, slots=True)
class FallbackOptions:
    """Cacheblend's fallback where the check layer's deviation is not sparse (workers/fusion/cacheblend.py)."""

    min_coverage: float = 0.0  # share of the check layer's deviation the kept set must hold (0: off)
    full_above: float = 0.5  # a needed recompute_ratio above this recomputes in full

    def __post_init__(self) -> None:
        check(0.0 <= self.min_coverage <= 1.0, "fallback.min_coverage", "in [0, 1]", self.min_coverage)
        check(0.0 < self.full_above <= 1.0, "fallback.full_above", "in (0, 1]", self.full_above)


@dataclass(frozen=True, slots=True)
class FusionOptions:
    """Knobs of the fusion modes, fixed when the engine is built; each mode's own in its dataclass."""

    recompute_ratio: float = 0.15
    deviation_metric: str = "kv"
    filter_layers: tuple[int, ...] = CHECK_LAYER_FILTER_LAYERS
    filter_multipliers: tuple[float, ...] = CHECK_LAYER_FILTER_MULTIPLIERS
    selection_span_tokens: int = 16  # cacheblend: recompute whole aligned spans of this many positions
    epic_tokens: int | None = None
    craft: CraftOptions = field(default_factory=CraftOptions)
    prefix_cache: PrefixCacheOptions = field(default_factory=PrefixCacheOptions)
    fallback: FallbackOptions = field(default_factory=FallbackOptions)

    def __post_init__(self) -> None:
        check(0.0 <= self.recompute_ratio <= 1.0, "recompute_ratio", "in [0, 1]", self.recompute_ratio)
        check(self.deviation_metric in DEVIATION_METRICS, "deviation_metric", f"one of {DEVIATION_METRICS}",
              self.deviation_metric)
        check_filter_schedule(self.filter_layers, self.filter_multipliers, first_layer=1)
        check(self.filter_multipliers[-1] == 1.0, "filter_multipliers", "ending at 1.0 (the target ratio)",
              self.filter_multipliers)
        check_count("selection_span_tokens", self.selection_span_tokens, 1)
        check(self.epic_tokens is None or self.epic_tokens >= 0, "epic_tokens", "an int >= 0 or null", self.epic_tokens)

    def with_gradual_filtering(self) -> "FusionOptions":
        """These options with the paper's filter schedule: keep 2r at layer 1, narrow to r at layer 2."""
        return replace(self, filter_layers=GRADUAL_FILTER_LAYERS, filter_multipliers=GRADUAL_FILTER_MULTIPLIERS)


def check_filter_schedule(layers: tuple[int, ...], multipliers: tuple[float, ...], first_layer: int) -> None:
    """Filter layers strictly ascending from `first_layer` on, each with a multiplier of the recompute_ratio >= 1."""
    check(
        len(layers) == len(multipliers) and len(layers) > 0,
        "filter_layers, filter_multipliers",
        "non-empty and of equal length",
        (layers, multipliers),
    )
    check(
        list(layers) == sorted(set(layers)) and layers[0] >= first_layer,
        "filter_layers",
        f"strictly ascending from layer {first_layer} on",
        layers,
    )
    check(all(m >= 1.0 for m in multipliers), "filter_multipliers", "all >= 1", multipliers)


class FusionMode(ABC):
    """A strategy that fills a request's KV cache from cached chunks and selective recompute."""

    name: ClassVar[str]
    reads_chunk_cache: ClassVar[bool] = True
    reads_question: ClassVar[bool] = False  # the context KV it fills depends on the question

    def __init__(self, options: FusionOptions) -> None:
        self.options = options

    def prefill(
        self,
        runner: ModelRunner,
        layout: BlendLayout,
        cache: KVCache,
        recompute_ratio: float,
        feed: LayerFeed | None = None,
    ) -> PrefillResult:
        """Recompute the tokens this mode chooses over the cached KV (placed first, or arriving through `feed`)."""
        if self.reads_chunk_cache and feed is None:
            layout.load_cached(cache, runner.rerotate_keys)
        narrow = (lambda step: self.narrow(step, recompute_ratio)) if self.narrows else None
        return selective_prefill(runner, layout, cache, self.initial(layout, recompute_ratio), narrow, feed)

    @property
    def narrows(self) -> bool:
        """Whether the mode shrinks the recomputed set during the pass."""
        return type(self).narrow is not FusionMode.narrow

    def initial(self, layout: BlendLayout, recompute_ratio: float) -> torch.Tensor:
        """Ascending positions recomputed from layer 0 (always including layout.forced); by default all."""
        return all_positions(layout)

    def narrow(self, step: LayerStep, recompute_ratio: float) -> torch.Tensor | None:
        """Indices into step.positions kept past this layer; None keeps all."""
        return None


def all_positions(layout: BlendLayout) -> torch.Tensor:
    """Every position whose KV the pass computes."""
    return torch.arange(layout.kv_end)


def inexact_positions(layout: BlendLayout) -> torch.Tensor:
    """Every position whose KV the pass computes but the leading exact run (BlendLayout.exact_end), and the forced.

    The exact run's cached KV is what a full prefill computes there, so recomputing it changes nothing.
    """
    keep = torch.ones(layout.kv_end, dtype=torch.bool)
    keep[: layout.exact_end()] = False
    return (keep | layout.forced).nonzero().squeeze(1)
