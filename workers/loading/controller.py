"""The loading controller a worker runs: its calibrated recompute model, its fetch telemetry, and its options."""
from collections.abc import Mapping, Sequence
from dataclasses import replace

from kvplane.tiers.latency import LoadQuantiles, LoadTelemetry
from workers.fusion.base import FusionOptions
from workers.loading.delay_model import DEFAULT_SHAPES, RecomputeDelayModel, calibrate_runner
from workers.loading.plan import ChunkPlacement, ControllerOptions, LoadingPlan, plan_loading
from workers.model.runner import ModelRunner

# A tier never observed is priced like a modest network fetch of a 256 KiB layer-chunk: neither free nor forbidden.
DEFAULT_PRIOR = LoadQuantiles(p50_s=0.002, p95_s=0.01, p99_s=0.03, typical_bytes=256 << 10)


class LoadingController:
    """Plans each request from the recompute model and the fetch-latency sketches, which the loader keeps fed."""

    def __init__(
        self,
        delays: RecomputeDelayModel,
        telemetry: LoadTelemetry | None = None,
        options: ControllerOptions = ControllerOptions(),
    ) -> None:
        self.delays = delays
        self.telemetry = telemetry if telemetry is not None else LoadTelemetry({}, DEFAULT_PRIOR)
        self.options = options
        self.last_plan: LoadingPlan | None = None

    def observe(self, tier: str, seconds: float, num_bytes: int) -> None:
        """Record one layer-chunk fetch (the layer loader's FetchObserver)."""
        self.telemetry.observe(tier, seconds, num_bytes)

    def plan(
        self, chunks: Sequence[ChunkPlacement], forced_tokens: int, recompute_ratio: float | None = None
    ) -> LoadingPlan:
        """The ratio (at least the floor and the request's `recompute_ratio`) and per-chunk tier or recompute."""
        options = self.options
        if recompute_ratio is not None and recompute_ratio > options.ratio_floor:
            ceiling = max(recompute_ratio, options.ratio_ceiling)
            options = replace(options, ratio_floor=recompute_ratio, ratio_ceiling=ceiling)
        quantiles = self.telemetry.snapshot({tier for chunk in chunks for tier in chunk.tiers})
        self.last_plan = plan_loading(chunks, self.delays, quantiles, options, forced_tokens)
        return self.last_plan


def calibrate_controller(
    runner: ModelRunner,
    fusion: FusionOptions = FusionOptions(),
    priors: Mapping[str, LoadQuantiles] | None = None,
    shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
    repeats: int = 3,
    **overrides: object,
) -> LoadingController:
    """Time the runner's layers on its device (seconds; once at worker start) and build a controller around it.

    `priors` price tiers before 20 fetches from them are observed; `overrides` set ControllerOptions knobs.
    """
    delays = calibrate_runner(runner, shapes, repeats)
    telemetry = LoadTelemetry(priors or {}, DEFAULT_PRIOR)
    return LoadingController(delays, telemetry, ControllerOptions.from_fusion(fusion, **overrides))
