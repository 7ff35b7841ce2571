"""Per-tier fetch-latency telemetry: quantile sketches, priors, size scaling, thread safety, the timing wrapper."""
import random
import threading

import pytest
import torch

from kvplane.tiers.jitter import JitterConfig, JitterTier
from kvplane.tiers.latency import LoadQuantiles, LoadTelemetry, TierLatency, TimedTier
from kvplane.tiers.memory import MemoryTier

PRIOR = LoadQuantiles(0.001, 0.002, 0.004)


def test_quantiles_track_observations_after_the_prior() -> None:
    latency = TierLatency(PRIOR, min_observations=10)
    rng = random.Random(0)
    for _ in range(9):
        latency.observe(0.5, 1000)
    assert latency.quantiles() == PRIOR
    values = [rng.lognormvariate(-6.0, 0.8) for _ in range(5000)]
    for value in values:
        latency.observe(value, 2000)
    quantiles = latency.quantiles()
    everything = sorted([0.5] * 9 + values)
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        assert quantiles.at(name) == pytest.approx(everything[int(q * len(everything))], rel=0.03)
    assert quantiles.num_observations == 5009
    assert quantiles.typical_bytes == round((9 * 1000 + 5000 * 2000) / 5009)


def test_fetch_time_scales_with_size_from_the_typical_fetch() -> None:
    quantiles = LoadQuantiles(0.01, 0.02, 0.05, typical_bytes=1000)
    assert quantiles.fetch_s("p95", 2000) == pytest.approx(0.04)
    assert quantiles.fetch_s("p50", 500) == pytest.approx(0.005)
    assert LoadQuantiles(0.01, 0.02, 0.05).fetch_s("p99", 10**9) == 0.05
    with pytest.raises(ValueError, match="quantile"):
        quantiles.at("p90")
    with pytest.raises(ValueError, match="p50_s <= p95_s"):
        LoadQuantiles(0.02, 0.01, 0.05)


def test_a_fetch_in_a_sum_is_priced_by_the_sums_quantile() -> None:
    rng = random.Random(1)
    latency = TierLatency(PRIOR, min_observations=1)
    fetches = [rng.lognormvariate(-4.0, 1.0) for _ in range(20000)]
    for value in fetches:
        latency.observe(value, 1000)
    quantiles = latency.quantiles()
    assert quantiles.mean_s == pytest.approx(sum(fetches) / len(fetches), rel=0.01)
    assert quantiles.fetch_in_sum_s("p95", 1000, 1) == pytest.approx(quantiles.p95_s)  # one fetch: its own tail
    # 300 fetches: the sum's p95 per fetch sits just above the mean, far below the single fetch's p95.
    sums = sorted(sum(rng.choice(fetches) for _ in range(300)) for _ in range(2000))
    assert 300 * quantiles.fetch_in_sum_s("p95", 1000, 300) == pytest.approx(sums[int(0.95 * len(sums))], rel=0.05)
    assert quantiles.fetch_in_sum_s("p95", 2000, 300) == pytest.approx(2 * quantiles.fetch_in_sum_s("p95", 1000, 300))
    assert LoadQuantiles(0.01, 0.02, 0.05).fetch_in_sum_s("p95", 0, 4) == pytest.approx(0.015)  # no mean: the median


def test_telemetry_keeps_a_sketch_per_tier_and_priors_for_unseen_ones() -> None:
    remote_prior = LoadQuantiles(0.005, 0.02, 0.08)
    telemetry = LoadTelemetry({"remote": remote_prior}, PRIOR, min_observations=1)
    telemetry.observe("ram", 0.0001, 4096)
    snapshot = telemetry.snapshot(["s3"])
    assert set(snapshot) == {"ram", "remote", "s3"}
    assert snapshot["remote"] == remote_prior and snapshot["s3"] == PRIOR
    assert snapshot["ram"].p50_s == pytest.approx(0.0001, rel=0.02) and snapshot["ram"].typical_bytes == 4096
    with pytest.raises(ValueError, match="seconds"):
        telemetry.observe("ram", -1.0, 10)


def test_concurrent_observations_are_all_counted() -> None:
    telemetry = LoadTelemetry({}, PRIOR)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(2000):
            telemetry.observe(rng.choice(["ram", "ssd"]), rng.random() * 0.01, 100)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert telemetry.tier("ram").num_observations + telemetry.tier("ssd").num_observations == 8000


def test_timed_tier_observes_the_jittered_tail() -> None:
    telemetry = LoadTelemetry({}, PRIOR, min_observations=1)
    slow = JitterTier(MemoryTier("remote", 1 << 20), JitterConfig(0.001, 0.2, 0.2, 0.01, seed=5))
    timed = TimedTier(slow, telemetry, min_bytes=16)
    blob = torch.arange(64, dtype=torch.uint8)
    timed.put("k", blob)
    for _ in range(60):
        assert torch.equal(timed.read("k"), blob)
    timed.read("k", 0, 8)  # a header probe: below min_bytes, not observed
    timed.read("absent")  # a miss: not observed
    quantiles = telemetry.snapshot()["remote"]
    assert quantiles.num_observations == 60 and quantiles.typical_bytes == 64
    assert quantiles.p50_s >= 0.0009 and quantiles.p95_s >= 0.01
    assert timed.contains("k") and list(timed.scan()) == [("k", 64)]
    timed.delete("k")
    assert not timed.contains("k")
