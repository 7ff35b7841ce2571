"""How much a cached byte is worth per tier, and how many cached bytes one unit of load costs."""
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kvplane.checks import check, check_non_negative
from scheduler.load import WorkerLoad

DEFAULT_TIER_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"device": 1.0, "ram": 0.8, "ssd": 0.5, "remote": 0.3, "object": 0.1}
)
"""Faster tiers first: a byte already in HBM saves the most time to first token, one in the object store the least."""

MiB = 1 << 20
KiB = 1 << 10


@dataclass(frozen=True, slots=True)
class RouterWeights:
    """Scoring knobs: tier weight per cached byte, and the load penalty in byte-equivalents."""

    tier_weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_TIER_WEIGHTS)
    # One queued request delays a new one by about as long as recomputing a few chunks (~16 MiB of KV).
    penalty_bytes_per_queued: float = 16 * MiB
    # A token in flight costs about as much compute as its own KV (SmolLM2-135M: ~23 KiB per token).
    penalty_bytes_per_token_in_flight: float = 16 * KiB

    def __post_init__(self) -> None:
        check(len(self.tier_weights) > 0, "tier_weights", "a non-empty mapping of tier to weight", self.tier_weights)
        for tier, weight in self.tier_weights.items():
            check_non_negative(f"tier_weights[{tier!r}]", weight)
        check_non_negative("penalty_bytes_per_queued", self.penalty_bytes_per_queued)
        check_non_negative("penalty_bytes_per_token_in_flight", self.penalty_bytes_per_token_in_flight)
        # Frozen all the way down: a caller's dict mutated later must not change validated weights.
        object.__setattr__(self, "tier_weights", MappingProxyType(dict(self.tier_weights)))

    def tier_weight(self, tier: str) -> float:
        """Weight of one cached byte in `tier`; an unweighted tier brings no affinity rather than failing a request."""
        return self.tier_weights.get(tier, 0.0)

    def penalty_bytes(self, load: WorkerLoad) -> float:
        """Load of a worker expressed in cached bytes it would have to outweigh."""
        return (
            self.penalty_bytes_per_queued * load.num_queued
            + self.penalty_bytes_per_token_in_flight * load.num_tokens_in_flight
        )
