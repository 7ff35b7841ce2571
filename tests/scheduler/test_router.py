"""Router: affinity normally, power-of-two under imbalance (never onto a full worker), rendezvous home when cold."""
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.load import WorkerLoad
from scheduler.rendezvous import home_worker
from scheduler.router import Route, Router, RouteReason
from scheduler.scoring import Chunk
from scheduler.weights import MiB

CAPACITY = 8
CHUNKS = [Chunk("a", 8 * MiB), Chunk("b", 8 * MiB)]


def idle(*workers: str) -> dict[str, WorkerLoad]:
    return {worker: WorkerLoad(0, 0, CAPACITY) for worker in workers}


def test_request_goes_to_the_worker_holding_its_chunks() -> None:
    locations = {"a": {"w1": "ram", "w2": "ssd"}, "b": {"w1": "ram"}}
    assert Router().route(CHUNKS, locations, idle("w0", "w1", "w2")) == Route("w1", RouteReason.SCORE)


def test_holder_loses_on_score_once_its_queue_outweighs_its_cache() -> None:
    loads = {"holder": WorkerLoad(2, 0, CAPACITY), "idle": WorkerLoad(0, 0, CAPACITY)}
    locations = {"a": {"holder": "device"}, "b": {"holder": "device"}}
    assert Router().route(CHUNKS, locations, loads) == Route("idle", RouteReason.SCORE)


def test_overloaded_holder_is_bypassed_for_power_of_two_despite_its_score() -> None:
    # Chunks so large that the score still prefers the holder: only the imbalance rule moves the request.
    chunks = [Chunk("a", 4096 * MiB)]
    loads = idle("w0", "w1") | {"holder": WorkerLoad(6, 0, CAPACITY)}
    route = Router(rng=random.Random(0)).route(chunks, {"a": {"holder": "device"}}, loads)
    assert route.reason is RouteReason.BALANCE and route.worker_id in {"w0", "w1"}


def test_full_holder_is_bypassed_even_without_imbalance() -> None:
    loads = {"holder": WorkerLoad(CAPACITY, 0, CAPACITY), "other": WorkerLoad(CAPACITY - 1, 0, CAPACITY)}
    route = Router().route([Chunk("a", 4096 * MiB)], {"a": {"holder": "device"}}, loads)
    assert route == Route("other", RouteReason.BALANCE)


def test_when_every_worker_is_full_locality_is_kept_for_admission_to_refuse() -> None:
    loads = {worker: WorkerLoad(CAPACITY, 0, CAPACITY) for worker in ("w0", "w1")}
    assert Router().route(CHUNKS, {"a": {"w1": "ram"}}, loads) == Route("w1", RouteReason.SATURATED)


loads_strategy = st.dictionaries(
    st.sampled_from([f"w{i}" for i in range(6)]),
    st.builds(WorkerLoad, st.integers(0, CAPACITY), st.integers(0, 10_000), st.just(CAPACITY)),
    min_size=1,
)
locations_strategy = st.dictionaries(
    st.sampled_from(["a", "b"]),
    st.dictionaries(st.sampled_from([f"w{i}" for i in range(7)]), st.sampled_from(["device", "ram", "ssd"])),
)


@given(loads_strategy, locations_strategy, st.integers(0, 2**32), st.booleans())
def test_never_routes_to_a_full_worker_while_one_has_room(
    loads: dict[str, WorkerLoad], locations: dict, seed: int, with_chunks: bool
) -> None:
    route = Router(rng=random.Random(seed)).route(CHUNKS if with_chunks else [], locations, loads)
    assert route.worker_id in loads
    if any(not load.is_full for load in loads.values()):
        assert not loads[route.worker_id].is_full


def test_cold_request_goes_to_its_first_chunks_home() -> None:
    workers = [f"w{i}" for i in range(5)]
    for i in range(200):
        chunks = [Chunk(f"key-{i}", MiB), Chunk(f"other-{i}", MiB)]
        assert Router().route(chunks, {}, idle(*workers)) == Route(home_worker(f"key-{i}", workers), RouteReason.COLD)


def test_cold_homes_stay_put_when_an_unrelated_worker_leaves() -> None:
    workers = [f"w{i}" for i in range(5)]
    survivors = [worker for worker in workers if worker != "w3"]
    router = Router()
    for i in range(300):
        chunks = [Chunk(f"key-{i}", MiB)]
        before = router.route(chunks, {}, idle(*workers)).worker_id
        after = router.route(chunks, {}, idle(*survivors)).worker_id
        if before != "w3":
            assert after == before


def test_copies_on_departed_workers_do_not_count() -> None:
    route = Router().route(CHUNKS, {"a": {"gone": "device"}}, idle("w0", "w1"))
    assert route == Route(home_worker("a", ["w0", "w1"]), RouteReason.COLD)


def test_request_without_chunks_is_balanced() -> None:
    loads = {"busy": WorkerLoad(5, 0, CAPACITY), "free": WorkerLoad(0, 0, CAPACITY)}
    assert Router(rng=random.Random(1)).route([], {}, loads) == Route("free", RouteReason.BALANCE)


def test_same_seed_same_decisions() -> None:
    loads = idle("w0", "w1", "w2", "w3") | {"holder": WorkerLoad(7, 0, CAPACITY)}
    locations = {"a": {"holder": "device"}}

    def decisions(seed: int) -> list[str]:
        router = Router(rng=random.Random(seed))
        return [router.route(CHUNKS, locations, loads).worker_id for _ in range(20)]

    assert decisions(7) == decisions(7)


def test_no_live_workers_is_an_error() -> None:
    with pytest.raises(ValueError, match="loads"):
        Router().route(CHUNKS, {}, {})
