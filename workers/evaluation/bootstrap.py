"""Percentile bootstrap intervals of a mean over records (pure functions)."""
from collections.abc import Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000


def bootstrap_interval(
    values: Sequence[float], confidence: float = 0.95, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """The `confidence` percentile-bootstrap interval of the mean of `values` (records resampled with replacement)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no values to bootstrap")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)  # [resamples]
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def paired_difference_interval(
    first: Sequence[float], second: Sequence[float], confidence: float = 0.95, resamples: int = DEFAULT_RESAMPLES
) -> tuple[float, float]:
    """Bootstrap interval of mean(first - second) over the same records (resampled together)."""
    if len(first) != len(second):
        raise ValueError(f"paired values need equal lengths, got {len(first)} and {len(second)}")
    return bootstrap_interval([a - b for a, b in zip(first, second)], confidence, resamples)


def paired_ratio_interval(
    first: Sequence[float], second: Sequence[float], confidence: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Bootstrap interval of mean(first) / mean(second) over the same records (resampled together).

    Resamples whose `second` mean is 0 have no ratio and are left out; NaNs when every one is.
    """
    if len(first) != len(second) or not first:
        raise ValueError(f"paired values need equal, non-zero lengths, got {len(first)} and {len(second)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    rows = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))  # [resamples, records]
    numerators, denominators = a[rows].mean(axis=1), b[rows].mean(axis=1)
    ratios = numerators[denominators > 0] / denominators[denominators > 0]
    if ratios.size == 0:
        return float("nan"), float("nan")
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)


def paired_median_ratio_interval(
    first: Sequence[float], second: Sequence[float], resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """95% bootstrap interval of median(first) / median(second), the same items resampled on both sides."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))  # [resamples, items]
    ratios = np.median(a[picks], axis=1) / np.median(b[picks], axis=1)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return float(low), float(high)
