"""A worker's quality guardrails: the canary gate, the cacheblend fallback, shadow runs, the controller."""

from dataclasses import dataclass

from kvplane.checks import check
from workers.chunks.store import ChunkStore, LocalChunkStore
from workers.fuser import Fuser
from workers.fusion.base import FusionOptions
from workers.generation.prompt import PromptTemplate
from workers.guardrails.canary import DEFAULT_MAX_DEVIATION, canary_verdict
from workers.loading.controller import calibrate_controller
from workers.model.runner import ModelRunner


@dataclass(frozen=True, slots=True)
class GuardrailsConfig:
    """Quality guardrails of every worker: the canary gate, the per-request fallback, shadow comparison."""

    canary: bool = True  # fuse a canary prompt at start; refuse blending if it deviates from full prefill
    canary_max_deviation: float = DEFAULT_MAX_DEVIATION  # relative KV deviation above which the canary fails
    fallback_min_coverage: float = 0.5  # cacheblend: share of check-layer deviation the kept tokens must hold
    shadow_fraction: float = 0.0  # blended requests also run in full prefill off the hot path, compared
    controller: bool = False  # calibrate the loading controller at start and let it pick ratio and tiers
    # Teacher-forced KL a tier's compression may add to fused prompts (None: 0.005 for int8, 0.02 for int4)
    compression_max_kl_increase: float | None = None

    def __post_init__(self) -> None:
        check(self.canary_max_deviation > 0, "canary_max_deviation", "a number > 0", self.canary_max_deviation)
        check(
            0.0 <= self.fallback_min_coverage <= 1.0, "fallback_min_coverage", "in [0, 1]", self.fallback_min_coverage
        )
        check(0.0 <= self.shadow_fraction <= 1.0, "shadow_fraction", "in [0, 1]", self.shadow_fraction)
        bound = self.compression_max_kl_increase
        check(bound is None or bound >= 0, "compression_max_kl_increase", "a number >= 0 or null", bound)


def guarded_fuser(
    runner: ModelRunner,
    options: FusionOptions,
    store: ChunkStore,
    template: PromptTemplate,
    chunk_context: str,
    guardrails: GuardrailsConfig,
) -> Fuser:
    """The serving Fuser, its controller calibrated and its canary verdict taken before it is built."""
    controller = calibrate_controller(runner, options) if guardrails.controller else None
    refused = None
    if guardrails.canary:
        probe = Fuser(runner, options, store=LocalChunkStore(), template=template, chunk_context=chunk_context)
        refused = canary_verdict(probe, max_deviation=guardrails.canary_max_deviation)
    return Fuser(
        runner,
        options,
        store=store,
        template=template,
        chunk_context=chunk_context,
        controller=controller,
        blending_refused=refused,
    )
