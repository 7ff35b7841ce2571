"""The jitter tier: delays follow the configured heavy-tailed distribution, data passes through unchanged."""
import statistics
import time

import pytest
import torch

from kvplane.tiers.jitter import JitterConfig, JitterTier, delay_quantile_s, draw_delay_s
from kvplane.tiers.memory import MemoryTier


def _quantile(values: list[float], quantile: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


def test_recorded_delays_have_the_configured_median_and_tail() -> None:
    config = JitterConfig(median_s=0.002, sigma=0.5, spike_probability=0.03, spike_s=0.05, seed=7)
    slept: list[float] = []
    tier = JitterTier(MemoryTier("remote", 1 << 20), config, sleep=slept.append)
    tier.put("k", torch.arange(8, dtype=torch.uint8))
    for _ in range(20000):
        tier.read("k")
    assert len(slept) == 20000  # put is not delayed by default
    for quantile in (0.5, 0.9, 0.95, 0.99):
        expected = delay_quantile_s(config, quantile)
        assert _quantile(slept, quantile) == pytest.approx(expected, rel=0.08), quantile
    # The spikes make the tail heavy: p99 sits past the spike while the median ignores it.
    assert delay_quantile_s(config, 0.99) > config.spike_s > 10 * delay_quantile_s(config, 0.5)
    assert delay_quantile_s(config, 0.5) == pytest.approx(0.002, rel=0.05)


def test_real_sleeps_follow_the_distribution() -> None:
    config = JitterConfig(median_s=0.002, sigma=0.3, spike_probability=0.1, spike_s=0.01, seed=3)
    tier = JitterTier(MemoryTier("remote", 1 << 20), config)
    tier.put("k", torch.ones(4, dtype=torch.uint8))
    observed = []
    for _ in range(150):
        began = time.perf_counter()
        tier.read("k")
        observed.append(time.perf_counter() - began)
    # Sleeps overshoot by scheduler noise only: generous upper bounds, tight lower ones.
    assert 0.0018 <= statistics.median(observed) <= 0.0045
    assert _quantile(observed, 0.95) >= 0.01
    assert sum(observed) < 1.5


def test_data_passes_through_unchanged_and_seeds_repeat() -> None:
    inner = MemoryTier("ssd", 1 << 20)
    config = JitterConfig(median_s=0.001, operations=("put", "read", "delete", "contains", "scan"), seed=11)
    slept: list[float] = []
    tier = JitterTier(inner, config, sleep=slept.append)
    blob = torch.randint(0, 256, (64,), dtype=torch.uint8)
    tier.put("a", blob.clone())
    assert tier.name == "ssd" and tier.capacity_bytes == 1 << 20
    assert torch.equal(tier.read("a"), blob)
    assert torch.equal(tier.read("a", 8, 24), blob[8:24])
    assert tier.read("missing") is None
    assert tier.contains("a") and list(tier.scan("")) == [("a", 64)]
    tier.delete("a")
    assert not inner.contains("a")
    assert len(slept) == 7

    again: list[float] = []
    replay = JitterTier(MemoryTier("ssd", 1), config, sleep=again.append)
    for _ in range(7):
        replay.contains("x")
    assert again == slept


def test_draws_without_spread_or_spikes_are_constant() -> None:
    import random

    config = JitterConfig(median_s=0.004, sigma=0.0)
    assert {draw_delay_s(config, random.Random(seed)) for seed in range(5)} == {0.004}
    assert draw_delay_s(JitterConfig(median_s=0.0, spike_probability=1.0, spike_s=0.2), random.Random(0)) == 0.2
    assert delay_quantile_s(JitterConfig(0.0, spike_probability=0.1, spike_s=0.3), 0.95) == 0.3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"median_s": -1.0}, "median_s"),
        ({"median_s": 0.001, "sigma": -0.1}, "sigma"),
        ({"median_s": 0.001, "spike_probability": 1.5}, "spike_probability"),
        ({"median_s": 0.001, "spike_s": -1.0}, "spike_s"),
        ({"median_s": 0.001, "operations": ("get",)}, "operations"),
    ],
)
def test_config_is_validated(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JitterConfig(**kwargs)
