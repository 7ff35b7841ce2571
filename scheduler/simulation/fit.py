"""Fit the simulator's service model to measured requests: seconds per computed token and per reused token by tier."""
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler.simulation.simulator import TIERS, ServiceModel


@dataclass(frozen=True, slots=True)
class Observation:
    """One measured request that found its worker idle: tokens computed, tokens reused per tier, its TTFT."""

    computed_tokens: float
    ttft_s: float
    reused_tokens: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.computed_tokens < 0 or self.ttft_s < 0:
            raise ValueError("computed_tokens and ttft_s must be >= 0")


def _nonnegative_lstsq(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: refit without the negative ones until none is left."""
    active = list(range(features.shape[1]))
    coefficients = np.zeros(features.shape[1])
    while active:
        solution, *_ = np.linalg.lstsq(features[:, active], target, rcond=None)
        if (solution >= 0).all():
            coefficients[active] = solution
            break
        active = [column for column, value in zip(active, solution) if value > 0]
    return coefficients


def fit_service_model(
    observations: Sequence[Observation], decode_s: float, recompute_ratio: float = 0.15, serial_decode: bool = False
) -> ServiceModel:
    """TTFT = base + per computed token + per reused token of each tier, fitted with non-negative least squares."""
    if len(observations) < len(TIERS) + 2:
        raise ValueError(f"need at least {len(TIERS) + 2} observations, got {len(observations)}")
    features = np.array(
        [[1.0, o.computed_tokens, *(float(o.reused_tokens.get(tier, 0)) for tier in TIERS)] for o in observations]
    )
    coefficients = _nonnegative_lstsq(features, np.array([o.ttft_s for o in observations]))
    return ServiceModel(
        base_s=float(coefficients[0]), compute_s_per_token=float(coefficients[1]),
        reuse_s_per_token={tier: float(c) for tier, c in zip(TIERS, coefficients[2:])},
        decode_s=decode_s, recompute_ratio=recompute_ratio, serial_decode=serial_decode,
    )
