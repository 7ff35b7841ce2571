"""The cluster model: real router, admission and eviction policies over a modelled service time."""
import random

import pytest

from scheduler.admission import AdmissionConfig
from scheduler.simulation.fit import Observation, fit_service_model
from scheduler.simulation.routers import AFFINITY, POWER_OF_TWO, ROUND_ROBIN, make_router
from scheduler.simulation.simulator import (
    DEVICE,
    LOCAL,
    MISS,
    OBJECT,
    REMOTE,
    ClusterShape,
    ServiceModel,
    SimRequest,
    simulate,
)

BYTES_PER_TOKEN = 1000
SERVICE = ServiceModel(base_s=0.05, compute_s_per_token=0.001, reuse_s_per_token={REMOTE: 0.0002, OBJECT: 0.0004},
                       decode_s=0.2, recompute_ratio=0.15)


def _topic_requests(num_requests: int, num_topics: int, rate_rps: float, seed: int = 0) -> list[SimRequest]:
    """Requests about a few topics; each topic's 4 chunks recur, in varying order, with one private chunk."""
    rng = random.Random(seed)
    requests, clock = [], 0.0
    for i in range(num_requests):
        clock += rng.expovariate(rate_rps)
        topic = rng.randrange(num_topics)
        shared = [(f"t{topic}-c{j}", 100) for j in range(4)]
        rng.shuffle(shared)
        requests.append(SimRequest(clock, (*shared, (f"private-{i}", 100)), num_other_tokens=50))
    return requests


def test_affinity_keeps_recurring_chunks_on_the_device_of_their_worker_unlike_cache_blind_routing() -> None:
    requests = _topic_requests(400, num_topics=12, rate_rps=2.0)
    shape = ClusterShape(num_nodes=4, device_bytes=2_000_000, shard_bytes=4_000_000)
    device_share = {
        policy: simulate(requests, shape, make_router(policy, seed=1), SERVICE, BYTES_PER_TOKEN).hit_rates()[DEVICE]
        for policy in (AFFINITY, POWER_OF_TWO, ROUND_ROBIN)
    }
    assert device_share[AFFINITY] > 1.5 * device_share[POWER_OF_TWO]
    assert device_share[AFFINITY] > 1.5 * device_share[ROUND_ROBIN]


def test_a_chunk_is_missed_first_then_reused_and_the_reuse_is_faster() -> None:
    shape = ClusterShape(num_nodes=1, device_bytes=10_000_000, shard_bytes=0, object_tier=False)
    chunks = (("a", 200), ("b", 200))
    result = simulate([SimRequest(0.0, chunks), SimRequest(10.0, chunks[::-1])], shape, make_router(AFFINITY),
                      SERVICE, BYTES_PER_TOKEN)
    first, second = result.outcomes
    assert first.tokens == {MISS: 400} and second.tokens == {DEVICE: 400}
    assert first.ttft_s == pytest.approx(0.05 + 0.001 * 400)
    assert second.ttft_s == pytest.approx(0.05 + 0.001 * 60)


def test_fusions_on_one_worker_queue_behind_each_other() -> None:
    shape = ClusterShape(num_nodes=1, device_bytes=0, shard_bytes=0, object_tier=False)
    requests = [SimRequest(0.0, ((f"k{i}", 100),)) for i in range(3)]
    ttfts = [o.ttft_s for o in simulate(requests, shape, make_router(ROUND_ROBIN), SERVICE, BYTES_PER_TOKEN).outcomes]
    assert ttfts == pytest.approx([0.15, 0.30, 0.45])


def test_admission_refuses_past_the_queue_bound_and_frees_slots_when_requests_finish() -> None:
    shape = ClusterShape(num_nodes=1, device_bytes=0, shard_bytes=0, object_tier=False)
    burst = [SimRequest(0.0, ((f"k{i}", 100),)) for i in range(5)]
    later = [SimRequest(100.0, (("late", 100),))]
    result = simulate(burst + later, shape, make_router(AFFINITY), SERVICE, BYTES_PER_TOKEN,
                      AdmissionConfig(max_queued_per_worker=2))
    assert result.num_rejected == 3
    assert len(result.outcomes) == 3  # two of the burst and the late one, after the burst had finished


def test_without_device_tiers_a_chunk_is_read_from_its_home_shard_locally_on_one_node_and_remotely_on_another() -> None:
    shape = ClusterShape(num_nodes=2, device_bytes=0, shard_bytes=10_000_000, object_tier=False)
    keys = [f"k{i}" for i in range(40)]
    writes = [SimRequest(float(i), ((key, 10),)) for i, key in enumerate(keys)]
    reads = [SimRequest(100.0 + i, ((key, 10),)) for i, key in enumerate(keys)]
    outcomes = simulate(writes + reads, shape, make_router(ROUND_ROBIN), SERVICE, BYTES_PER_TOKEN).outcomes[40:]
    tiers = {tier for o in outcomes for tier in o.tokens}
    assert tiers == {LOCAL, REMOTE}  # round robin puts half the reads on the node that is not the chunk's home


def test_the_object_tier_serves_what_every_cache_evicted() -> None:
    shape = ClusterShape(num_nodes=1, device_bytes=0, shard_bytes=0, object_tier=True)
    result = simulate([SimRequest(0.0, (("a", 10),)), SimRequest(5.0, (("a", 10),))], shape, make_router(AFFINITY),
                      SERVICE, BYTES_PER_TOKEN)
    assert [o.tokens for o in result.outcomes] == [{MISS: 10}, {OBJECT: 10}]


def test_fit_recovers_the_coefficients_of_noise_free_observations() -> None:
    rng = random.Random(3)
    observations = []
    for _ in range(60):
        computed = rng.randrange(50, 1500)
        reused = {DEVICE: rng.randrange(0, 800), REMOTE: rng.randrange(0, 800)}
        ttft = 0.04 + 0.0012 * computed + 0.0001 * reused[DEVICE] + 0.0003 * reused[REMOTE]
        observations.append(Observation(computed, ttft, reused))
    model = fit_service_model(observations, decode_s=0.3)
    assert model.base_s == pytest.approx(0.04, rel=1e-6)
    assert model.compute_s_per_token == pytest.approx(0.0012, rel=1e-6)
    assert model.reuse_s_per_token[REMOTE] == pytest.approx(0.0003, rel=1e-6)
    assert model.reuse_s_per_token[LOCAL] == 0.0 and model.decode_s == 0.3


def test_fit_keeps_coefficients_non_negative() -> None:
    observations = [Observation(100.0 * i, 1.0 - 0.001 * i, {DEVICE: 10 * i}) for i in range(1, 20)]
    model = fit_service_model(observations, decode_s=0.0)
    assert model.compute_s_per_token >= 0 and all(v >= 0 for v in model.reuse_s_per_token.values())


@pytest.mark.parametrize("bad", [{"base_s": -1.0}, {"recompute_ratio": 1.5}, {"reuse_s_per_token": {DEVICE: -0.1}}])
def test_service_model_refuses_impossible_values(bad: dict) -> None:
    with pytest.raises(ValueError):
        ServiceModel(**{"base_s": 0.0, "compute_s_per_token": 0.0, **bad})


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        make_router("random")


def test_a_serial_engine_holds_the_worker_through_decode_and_a_batching_one_does_not() -> None:
    shape = ClusterShape(num_nodes=1, device_bytes=0, shard_bytes=0, object_tier=False)
    requests = [SimRequest(0.0, (("a", 100),)), SimRequest(0.0, (("b", 100),))]
    batching = simulate(requests, shape, make_router(AFFINITY), SERVICE, BYTES_PER_TOKEN).outcomes
    serial_service = ServiceModel(0.05, 0.001, decode_s=0.2, serial_decode=True)
    serial = simulate(requests, shape, make_router(AFFINITY), serial_service, BYTES_PER_TOKEN).outcomes
    assert [o.ttft_s for o in batching] == pytest.approx([0.15, 0.30])
    assert [o.ttft_s for o in serial] == pytest.approx([0.15, 0.50])
