"""A tier wrapper that adds heavy-tailed latency (lognormal plus rare spikes), for tests and benchmarks."""
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from kvplane.tiers.tier import Tier

OPERATIONS = ("put", "read", "delete", "contains", "scan")


@dataclass(frozen=True, slots=True)
class JitterConfig:
    """Each delayed call sleeps lognormal(median_s, sigma), plus spike_s with probability spike_probability."""

    median_s: float
    sigma: float = 0.5  # shape of the lognormal: p95 = median * exp(1.645 * sigma)
    spike_probability: float = 0.0
    spike_s: float = 0.0
    operations: tuple[str, ...] = ("read",)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.median_s < 0:
            raise ValueError(f"median_s must be >= 0, got {self.median_s}")
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if not 0.0 <= self.spike_probability <= 1.0:
            raise ValueError(f"spike_probability must be in [0, 1], got {self.spike_probability}")
        if self.spike_s < 0:
            raise ValueError(f"spike_s must be >= 0, got {self.spike_s}")
        unknown = sorted(set(self.operations) - set(OPERATIONS))
        if unknown:
            raise ValueError(f"unknown operations {unknown}; choose from {OPERATIONS}")


def draw_delay_s(config: JitterConfig, rng: random.Random) -> float:
    """One delay drawn from the configured distribution."""
    base = config.median_s * math.exp(config.sigma * rng.gauss(0.0, 1.0)) if config.median_s > 0 else 0.0
    return base + (config.spike_s if rng.random() < config.spike_probability else 0.0)


def delay_quantile_s(config: JitterConfig, quantile: float) -> float:
    """The exact `quantile` of the configured delay (lognormal mixed with its spike-shifted copy)."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    if config.median_s == 0 or config.sigma == 0:
        base = config.median_s
        return base + (config.spike_s if quantile > 1.0 - config.spike_probability else 0.0)
    normal = statistics.NormalDist()

    def cdf(seconds: float) -> float:
        def lognormal(x: float) -> float:
            return normal.cdf(math.log(x / config.median_s) / config.sigma) if x > 0 else 0.0

        return (1.0 - config.spike_probability) * lognormal(seconds) + config.spike_probability * lognormal(
            seconds - config.spike_s
        )

    # The mixture's CDF is monotone: bisect between 0 and a bound past the quantile.
    low, high = 0.0, config.median_s * math.exp(config.sigma * 10.0) + config.spike_s
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < quantile else (low, mid)
    return high


class JitterTier:
    """Delegates to a tier, sleeping a drawn delay before each configured operation; data passes unchanged."""

    def __init__(self, tier: Tier, config: JitterConfig, sleep: Callable[[float], None] = time.sleep) -> None:
        self.inner = tier
        self.name = tier.name
        self.capacity_bytes = tier.capacity_bytes
        self.reads_whole = tier.reads_whole
        self.config = config
        self._sleep = sleep
        self._rng = random.Random(config.seed)
        self._lock = threading.Lock()

    def _delay(self, operation: str) -> None:
        if operation not in self.config.operations:
            return
        with self._lock:
            seconds = draw_delay_s(self.config, self._rng)
        self._sleep(seconds)

    def put(self, key: str, blob: torch.Tensor) -> None:
        """Store through the wrapped tier."""
        self._delay("put")
        self.inner.put(key, blob)

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Read through the wrapped tier."""
        self._delay("read")
        return self.inner.read(key, start, end)

    def delete(self, key: str) -> None:
        """Delete through the wrapped tier."""
        self._delay("delete")
        self.inner.delete(key)

    def contains(self, key: str) -> bool:
        """Ask the wrapped tier."""
        self._delay("contains")
        return self.inner.contains(key)

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Scan the wrapped tier."""
        self._delay("scan")
        return self.inner.scan(prefix)

    def sweep_temporaries(self, older_than_s: float) -> int:
        """Writes here leave no temporaries."""
        return 0

    def hit_label(self) -> str | None:
        """No inner tiers to name."""
        return None

    def label_of(self, key: str) -> str:
        """No inner tiers: this tier's own name, without looking."""
        return self.name
