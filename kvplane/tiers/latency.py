"""Observed load latency per tier, as quantile sketches of one layer-chunk fetch, for the loading controller."""
import math
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
from ddsketch import DDSketch

from kvplane.tiers.tier import Tier

QUANTILES = ("p50", "p95", "p99")
# Relative accuracy of every sketch: a reported quantile is within 1% of a value actually observed.
RELATIVE_ACCURACY = 0.01


@dataclass(frozen=True, slots=True)
class LoadQuantiles:
    """Seconds one layer-chunk fetch of `typical_bytes` takes from a tier, at the median and in the tail."""

    p50_s: float
    p95_s: float
    p99_s: float
    typical_bytes: int = 0  # 0: size-independent (fetch time does not scale with bytes)
    num_observations: int = 0  # 0 for a prior
    mean_s: float | None = None  # None: taken to be the median (a prior that names no mean)

    def __post_init__(self) -> None:
        if not 0.0 <= self.p50_s <= self.p95_s <= self.p99_s:
            raise ValueError(f"need 0 <= p50_s <= p95_s <= p99_s, got {self.p50_s}, {self.p95_s}, {self.p99_s}")
        if self.typical_bytes < 0 or self.num_observations < 0:
            raise ValueError("typical_bytes and num_observations must be >= 0")
        if self.mean_s is not None and self.mean_s < 0:
            raise ValueError(f"mean_s must be >= 0, got {self.mean_s}")

    def at(self, quantile: str) -> float:
        """Seconds at `quantile` ("p50", "p95" or "p99") for a fetch of typical size."""
        if quantile not in QUANTILES:
            raise ValueError(f"unknown quantile {quantile!r}; choose from {QUANTILES}")
        return getattr(self, f"{quantile}_s")

    def fetch_s(self, quantile: str, num_bytes: int) -> float:
        """Seconds at `quantile` for a fetch of `num_bytes`, scaled in proportion to size from the typical fetch."""
        return self._scaled(self.at(quantile), num_bytes)

    def fetch_in_sum_s(self, quantile: str, num_bytes: int, num_fetches: int) -> float:
        """Share of one fetch in the `quantile` of a sum of `num_fetches` independent fetches like it.

        The sum's quantile sits above its mean by the single fetch's excess times sqrt(n) (exact for
        normal fetch times, the CLT's scaling otherwise): mean + (quantile - mean) / sqrt(n) per fetch.
        A tail still costs, but n fetches do not all hit it at once.
        """
        mean = self._scaled(self.p50_s if self.mean_s is None else self.mean_s, num_bytes)
        return mean + (self.fetch_s(quantile, num_bytes) - mean) / math.sqrt(max(1, num_fetches))

    def _scaled(self, seconds: float, num_bytes: int) -> float:
        """`seconds` of a typical fetch scaled to `num_bytes`."""
        if self.typical_bytes == 0 or num_bytes <= 0:
            return seconds
        return seconds * num_bytes / self.typical_bytes


class TierLatency:
    """Quantile sketch of one tier's fetch seconds, plus the bytes fetched; safe to share between threads."""

    def __init__(self, prior: LoadQuantiles, min_observations: int = 20) -> None:
        if min_observations < 1:
            raise ValueError(f"min_observations must be >= 1, got {min_observations}")
        self.prior = prior
        self.min_observations = min_observations
        self._sketch = DDSketch(RELATIVE_ACCURACY)
        self._bytes = 0
        self._lock = threading.Lock()

    def observe(self, seconds: float, num_bytes: int) -> None:
        """Record one fetch that took `seconds` and moved `num_bytes`."""
        if seconds < 0 or num_bytes < 0:
            raise ValueError(f"seconds and num_bytes must be >= 0, got {seconds}, {num_bytes}")
        with self._lock:
            self._sketch.add(seconds)
            self._bytes += num_bytes

    @property
    def num_observations(self) -> int:
        """Fetches recorded so far."""
        with self._lock:
            return int(self._sketch.count)

    def quantiles(self) -> LoadQuantiles:
        """Observed p50/p95/p99 once `min_observations` fetches are in, else the prior."""
        with self._lock:
            count = int(self._sketch.count)
            if count < self.min_observations:
                return self.prior
            p50, p95, p99 = (max(0.0, self._sketch.get_quantile_value(q)) for q in (0.5, 0.95, 0.99))
            typical_bytes = round(self._bytes / count)
            mean = max(0.0, float(self._sketch.avg))
        # Sketch quantiles are each within the accuracy bound but not forced monotone: make them so.
        p95 = max(p95, p50)
        return LoadQuantiles(p50, p95, max(p99, p95), typical_bytes, count, mean)


class LoadTelemetry:
    """Fetch-latency sketches of every tier by name; a tier never observed reports its prior."""

    def __init__(
        self, priors: Mapping[str, LoadQuantiles], default_prior: LoadQuantiles, min_observations: int = 20
    ) -> None:
        self._priors = dict(priors)
        self._default_prior = default_prior
        self._min_observations = min_observations
        self._tiers: dict[str, TierLatency] = {}
        self._lock = threading.Lock()

    def tier(self, name: str) -> TierLatency:
        """The sketch of tier `name`, created with its prior on first use."""
        with self._lock:
            latency = self._tiers.get(name)
            if latency is None:
                prior = self._priors.get(name, self._default_prior)
                latency = self._tiers[name] = TierLatency(prior, self._min_observations)
            return latency

    def observe(self, tier: str, seconds: float, num_bytes: int) -> None:
        """Record one fetch from `tier`."""
        self.tier(tier).observe(seconds, num_bytes)

    def snapshot(self, tiers: Iterable[str] = ()) -> dict[str, LoadQuantiles]:
        """Quantiles of every tier seen or given a prior, plus any named in `tiers` (the controller's input)."""
        with self._lock:
            names = [*self._tiers, *(name for name in self._priors if name not in self._tiers)]
        names += [name for name in tiers if name not in names]
        return {name: self.tier(name).quantiles() for name in names}


class TimedTier:
    """Wraps a tier and reports the seconds and bytes of each read of at least `min_bytes` to a telemetry."""

    # Header probes are small reads; `min_bytes` keeps them out of the per-layer fetch sketch.

    def __init__(self, tier: Tier, telemetry: LoadTelemetry, min_bytes: int = 0) -> None:
        self.inner = tier
        self.name = tier.name
        self.capacity_bytes = tier.capacity_bytes
        self.reads_whole = tier.reads_whole
        self.telemetry = telemetry
        self.min_bytes = min_bytes

    def put(self, key: str, blob: torch.Tensor) -> None:
        """Store through the wrapped tier."""
        self.inner.put(key, blob)

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Read through the wrapped tier, timing hits."""
        began = time.perf_counter()
        data = self.inner.read(key, start, end)
        seconds = time.perf_counter() - began
        if data is not None and data.numel() >= self.min_bytes:
            self.telemetry.observe(self.name, seconds, data.numel())
        return data

    def delete(self, key: str) -> None:
        """Delete through the wrapped tier."""
        self.inner.delete(key)

    def contains(self, key: str) -> bool:
        """Ask the wrapped tier."""
        return self.inner.contains(key)

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Scan the wrapped tier."""
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
