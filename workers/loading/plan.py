"""The loading controller: per request, the recompute ratio and, per chunk, the tier to load from or recompute."""
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvplane.checks import check, check_non_negative
from kvplane.tiers.latency import QUANTILES, LoadQuantiles
from workers.fusion.base import (
    CHECK_LAYER_FILTER_LAYERS,
    CHECK_LAYER_FILTER_MULTIPLIERS,
    FusionOptions,
    check_filter_schedule,
)
from workers.fusion.deviation import ratio_count
from workers.loading.delay_model import RecomputeDelayModel

# Below this relative difference two predicted TTFTs count as equal (float noise of the sums).
_TIE = 1e-9


@dataclass(frozen=True, slots=True)
class ChunkPlacement:
    """One chunk of a request: its length, the bytes of one of its layers, and the tiers holding its KV."""

    key: str
    num_tokens: int
    layer_bytes: int
    tiers: tuple[str, ...] = ()  # empty: a miss, so it must be computed

    def __post_init__(self) -> None:
        if self.num_tokens < 1:
            raise ValueError(f"chunk {self.key!r}: num_tokens must be >= 1, got {self.num_tokens}")
        if self.layer_bytes < 0:
            raise ValueError(f"chunk {self.key!r}: layer_bytes must be >= 0, got {self.layer_bytes}")


@dataclass(frozen=True, slots=True)
class ChunkAction:
    """What to do with one chunk: load its KV from `tier`, or recompute it from scratch (tier None)."""

    key: str
    tier: str | None

    @property
    def recompute(self) -> bool:
        """Whether the chunk is computed in full instead of loaded."""
        return self.tier is None


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    """Knobs of the controller; the filter schedule mirrors the fusion mode's (see FusionOptions)."""

    ratio_floor: float = 0.15  # r*: the quality floor, never gone below
    ratio_ceiling: float = 1.0
    ratio_step: float = 0.05
    objective: str = "p95"  # the TTFT quantile minimised: "p50", "p95" or "p99"
    free_slack: float = 0.0  # relative increase of the overlapped time accepted to recompute more (0: only hidden)
    filter_layers: tuple[int, ...] = CHECK_LAYER_FILTER_LAYERS
    filter_multipliers: tuple[float, ...] = CHECK_LAYER_FILTER_MULTIPLIERS

    def __post_init__(self) -> None:
        check(0.0 <= self.ratio_floor <= self.ratio_ceiling <= 1.0, "ratio_floor, ratio_ceiling",
              "0 <= ratio_floor <= ratio_ceiling <= 1", (self.ratio_floor, self.ratio_ceiling))
        check(0.0 < self.ratio_step <= 1.0, "ratio_step", "in (0, 1]", self.ratio_step)
        check(self.objective in QUANTILES, "objective", f"one of {QUANTILES}", self.objective)
        check_non_negative("free_slack", self.free_slack)
        check_filter_schedule(self.filter_layers, self.filter_multipliers, first_layer=0)

    @classmethod
    def from_fusion(cls, fusion: FusionOptions, **overrides: object) -> "ControllerOptions":
        """Options whose floor and filter schedule are the fusion mode's."""
        base: dict[str, object] = {
            "ratio_floor": fusion.recompute_ratio,
            "filter_layers": fusion.filter_layers,
            "filter_multipliers": fusion.filter_multipliers,
        }
        return cls(**{**base, **overrides})  # type: ignore[arg-type]

    def ratios(self) -> list[float]:
        """Candidate ratios from the floor to the ceiling, both included."""
        count = int((self.ratio_ceiling - self.ratio_floor) / self.ratio_step + _TIE)
        grid = [
            max(self.ratio_floor, round(self.ratio_floor + index * self.ratio_step, 9)) for index in range(count + 1)
        ]
        return grid if grid[-1] >= self.ratio_ceiling - _TIE else [*grid, self.ratio_ceiling]


@dataclass(frozen=True, slots=True)
class LoadingPlan:
    """The chosen recompute_ratio, one action per chunk (request order), and the TTFT predicted for them."""

    recompute_ratio: float
    actions: tuple[ChunkAction, ...]
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float

    def ttft_s(self, quantile: str) -> float:
        """Predicted TTFT at `quantile`."""
        if quantile not in QUANTILES:
            raise ValueError(f"unknown quantile {quantile!r}; choose from {QUANTILES}")
        return getattr(self, f"ttft_{quantile}_s")

    @property
    def recomputed(self) -> tuple[str, ...]:
        """Keys of the chunks recomputed from scratch."""
        return tuple(action.key for action in self.actions if action.recompute)

    def tier_of(self, key: str) -> str | None:
        """The tier chunk `key` loads from (None: recomputed)."""
        return next(action.tier for action in self.actions if action.key == key)


def selected_per_layer(
    num_layers: int, recompute_ratio: float, reusable_tokens: int, forced_tokens: int, options: ControllerOptions
) -> list[int]:
    """Tokens entering each layer's recompute under CacheBlend's gradual filtering."""
    # All tokens run up to and including the first filter layer; past filter layer f_j the kept
    # reusable share is recompute_ratio * multiplier_j, as the fusion mode's `narrow` keeps them.
    counts = []
    kept = reusable_tokens
    for layer in range(num_layers):
        counts.append(kept + forced_tokens)
        if layer in options.filter_layers:
            multiplier = options.filter_multipliers[options.filter_layers.index(layer)]
            kept = ratio_count(min(1.0, recompute_ratio * multiplier), reusable_tokens)
    return counts


def pipeline_ttft_s(load_s: Sequence[float], compute_s: Sequence[float]) -> float:
    """Seconds of a pass where loading layer i+1 overlaps recomputing layer i: load_0 + sum max(compute_i, load_i+1)."""
    if len(load_s) != len(compute_s):
        raise ValueError(f"need one load and one compute time per layer, got {len(load_s)} and {len(compute_s)}")
    if not compute_s:
        return 0.0
    following = [*load_s[1:], 0.0]
    return load_s[0] + sum(max(compute, load) for compute, load in zip(compute_s, following))


def predict_ttft_s(
    chunks: Sequence[ChunkPlacement],
    actions: Sequence[ChunkAction],
    recompute_ratio: float,
    delays: RecomputeDelayModel,
    quantiles: Mapping[str, LoadQuantiles],
    quantile: str,
    options: ControllerOptions,
    forced_tokens: int = 0,
) -> float:
    """Predicted TTFT of a plan with every layer-chunk fetch at its `quantile` time."""
    return _predict(chunks, actions, recompute_ratio, delays, quantiles, quantile, options, forced_tokens)[0]


def _predict(
    chunks: Sequence[ChunkPlacement],
    actions: Sequence[ChunkAction],
    recompute_ratio: float,
    delays: RecomputeDelayModel,
    quantiles: Mapping[str, LoadQuantiles],
    quantile: str,
    options: ControllerOptions,
    forced_tokens: int,
) -> tuple[float, float]:
    """(TTFT, seconds of the last layer's compute, which no load overlaps)."""
    # The request's fetches add up, so each is priced at its share of the sum's quantile (mean plus the
    # tail excess over sqrt(n)): a bad tail still costs what it risks, but not as if every fetch hit it.
    context = sum(chunk.num_tokens for chunk in chunks) + forced_tokens
    load_layer_s = 0.0
    reusable = 0
    forced = forced_tokens
    num_fetches = delays.num_layers * sum(1 for action in actions if action.tier is not None)
    for chunk, action in zip(chunks, actions, strict=True):
        if action.tier is None:
            forced += chunk.num_tokens
        else:
            reusable += chunk.num_tokens
            load_layer_s += quantiles[action.tier].fetch_in_sum_s(quantile, chunk.layer_bytes, num_fetches)
    counts = selected_per_layer(delays.num_layers, recompute_ratio, reusable, forced, options)
    compute = [delays.predict_s(context, count) for count in counts]
    return pipeline_ttft_s([load_layer_s] * delays.num_layers, compute), compute[-1]


def plan_loading(
    chunks: Sequence[ChunkPlacement],
    delays: RecomputeDelayModel,
    quantiles: Mapping[str, LoadQuantiles],
    options: ControllerOptions = ControllerOptions(),
    forced_tokens: int = 0,
) -> LoadingPlan:
    """Per-chunk actions minimising the predicted objective TTFT, then the highest ratio loading hides.

    `forced_tokens` are always recomputed besides the chunks (question suffix, uncached prefix).
    """
    if forced_tokens < 0:
        raise ValueError(f"forced_tokens must be >= 0, got {forced_tokens}")
    missing = sorted({tier for chunk in chunks for tier in chunk.tiers} - set(quantiles))
    if missing:
        raise ValueError(f"no load quantiles (observed or prior) for tiers {missing}")
    objective = options.objective

    def cost(actions: Sequence[ChunkAction], recompute_ratio: float) -> float:
        return predict_ttft_s(chunks, actions, recompute_ratio, delays, quantiles, objective, options, forced_tokens)

    # 1. Each held chunk from its tier with the best objective quantile (TTFT only grows with a fetch's time).
    num_fetches = delays.num_layers * sum(1 for chunk in chunks if chunk.tiers)
    actions = [ChunkAction(chunk.key, _fastest_tier(chunk, quantiles, objective, num_fetches)) for chunk in chunks]
    # 2. At the floor ratio, recompute from scratch the chunk that helps most, while one does.
    best = cost(actions, options.ratio_floor)
    while True:
        trials = [
            (cost(trial, options.ratio_floor), trial)
            for index, action in enumerate(actions)
            if not action.recompute
            for trial in [[*actions[:index], ChunkAction(action.key, None), *actions[index + 1 :]]]
        ]
        if not trials:
            break
        trial_cost, trial = min(trials, key=lambda pair: pair[0])
        if trial_cost >= best * (1 - _TIE):
            break
        best, actions = trial_cost, trial
    # 3. The highest ratio that keeps the overlapped layers' recompute hidden behind loading (within the
    # slack). Only the last layer's compute, which nothing overlaps, grows: 1/num_layers of the extra.
    ratios = options.ratios()
    overlapped = [
        ttft - last
        for ttft, last in (
            _predict(chunks, actions, recompute_ratio, delays, quantiles, objective, options, forced_tokens)
            for recompute_ratio in ratios
        )
    ]
    limit = min(overlapped) * (1 + options.free_slack) * (1 + _TIE)
    recompute_ratio = max(recompute_ratio for recompute_ratio, value in zip(ratios, overlapped) if value <= limit)
    p50, p95, p99 = (
        predict_ttft_s(chunks, actions, recompute_ratio, delays, quantiles, quantile, options, forced_tokens)
        for quantile in QUANTILES
    )
    return LoadingPlan(recompute_ratio, tuple(actions), p50, p95, p99)


def _fastest_tier(
    chunk: ChunkPlacement, quantiles: Mapping[str, LoadQuantiles], objective: str, num_fetches: int
) -> str | None:
    """The holding tier with the smallest objective-quantile share of the request's fetches (None for a miss)."""
    if not chunk.tiers:
        return None
    return min(chunk.tiers, key=lambda tier: quantiles[tier].fetch_in_sum_s(objective, chunk.layer_bytes, num_fetches))
