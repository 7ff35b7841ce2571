"""Scoring: faster tiers and more cached bytes rank first; load penalty can outweigh locality; deterministic ties."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.load import WorkerLoad
from scheduler.scoring import Chunk, score_workers, worker_views
from scheduler.weights import MiB, RouterWeights

WEIGHTS = RouterWeights()
IDLE = WorkerLoad(num_queued=0, num_tokens_in_flight=0, queue_capacity=8)
CHUNKS = [Chunk("a", 16 * MiB), Chunk("b", 16 * MiB)]


def ranking(views: dict[str, dict[str, str]], loads: dict[str, WorkerLoad]) -> list[str]:
    return [score.worker_id for score in score_workers(CHUNKS, views, loads, WEIGHTS)]


def test_worker_with_chunks_in_faster_tiers_ranks_first() -> None:
    views = {"ssd": {"a": "ssd", "b": "ssd"}, "dev": {"a": "device", "b": "device"}, "none": {}, "obj": {"a": "object"}}
    loads = {worker: IDLE for worker in views}
    assert ranking(views, loads) == ["dev", "ssd", "obj", "none"]


def test_more_cached_bytes_beat_fewer_in_a_faster_tier_when_the_weights_say_so() -> None:
    views = {"both_in_ram": {"a": "ram", "b": "ram"}, "one_on_device": {"a": "device"}}
    assert ranking(views, {worker: IDLE for worker in views}) == ["both_in_ram", "one_on_device"]


def test_loaded_holder_loses_once_the_penalty_outweighs_its_locality() -> None:
    # Holder's affinity is 32 MiB; each queued request costs 16 MiB: it still wins at 1, loses at 3.
    views = {"holder": {"a": "device", "b": "device"}, "idle": {}}

    def loads(num_queued: int) -> dict[str, WorkerLoad]:
        return {"holder": WorkerLoad(num_queued, 0, 8), "idle": IDLE}

    assert ranking(views, loads(1))[0] == "holder"
    assert ranking(views, loads(3))[0] == "idle"


def test_tokens_in_flight_count_against_a_worker() -> None:
    busy = WorkerLoad(num_queued=0, num_tokens_in_flight=4096, queue_capacity=8)
    assert ranking({}, {"a_busy": busy, "b_idle": IDLE}) == ["b_idle", "a_busy"]


def test_a_chunk_repeated_in_the_prompt_counts_once() -> None:
    scores = score_workers([Chunk("a", 100), Chunk("a", 100)], {"w": {"a": "device"}}, {"w": IDLE}, WEIGHTS)
    assert scores[0].affinity_bytes == 100


def test_tier_without_a_weight_brings_no_affinity() -> None:
    scores = score_workers(CHUNKS, {"w": {"a": "floppy"}}, {"w": IDLE}, WEIGHTS)
    assert scores[0].affinity_bytes == 0


def test_configured_weights_change_the_ranking() -> None:
    ssd_first = RouterWeights(tier_weights={"ssd": 1.0, "device": 0.1})
    views = {"dev": {"a": "device"}, "ssd": {"a": "ssd"}}
    scores = score_workers(CHUNKS, views, {worker: IDLE for worker in views}, ssd_first)
    assert [score.worker_id for score in scores] == ["ssd", "dev"]


@given(st.permutations(["w3", "w1", "w0", "w2"]))
def test_ties_break_by_worker_id_whatever_the_input_order(order: list[str]) -> None:
    assert ranking({}, {worker: IDLE for worker in order}) == ["w0", "w1", "w2", "w3"]


def test_only_live_workers_are_scored_and_viewed() -> None:
    views = worker_views({"a": {"dead": "device", "live": "ram"}}, ["live"])
    assert views == {"live": {"a": "ram"}}
    assert ranking(views, {"live": IDLE}) == ["live"]


@pytest.mark.parametrize(("key", "num_bytes", "field"), [("", 1, "key"), ("a", -1, "num_bytes")])
def test_bad_chunk_names_the_field(key: str, num_bytes: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Chunk(key, num_bytes)
