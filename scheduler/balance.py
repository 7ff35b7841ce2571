"""Load-balancing fallback: when is a worker too loaded, and power-of-two choices among the rest."""
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvplane.checks import check, check_at_least, check_count
from scheduler.load import WorkerLoad


def _busyness(load: WorkerLoad) -> tuple[int, int]:
    return (load.num_queued, load.num_tokens_in_flight)


@dataclass(frozen=True, slots=True)
class ImbalanceRule:
    """A worker is overloaded when full, or when its queue is both `queue_ratio` times and
    `min_queue_gap` requests longer than the least-loaded worker's."""

    queue_ratio: float = 4.0
    # The gap keeps 1-vs-0 queues, a ratio of infinity, from counting as imbalance.
    min_queue_gap: int = 4

    def __post_init__(self) -> None:
        check_at_least("queue_ratio", self.queue_ratio, 1.0)
        check_count("min_queue_gap", self.min_queue_gap, 1)

    def overloaded(self, worker: str, loads: Mapping[str, WorkerLoad]) -> bool:
        """Whether routing to `worker` would pile work on it while others idle."""
        load = loads[worker]
        least = min(load.num_queued for load in loads.values())
        gap = load.num_queued - least
        return load.is_full or (gap >= self.min_queue_gap and load.num_queued > self.queue_ratio * least)


def power_of_two(workers: Sequence[str], loads: Mapping[str, WorkerLoad], rng: random.Random) -> str:
    """The less busy of two distinct workers drawn at random from `workers`."""
    check(len(workers) > 0, "workers", "a non-empty sequence", workers)
    # Sorting first makes the draw depend only on the seed, not on the caller's ordering.
    drawn = rng.sample(sorted(workers), min(2, len(workers)))
    # A tie goes to the first drawn, i.e. at random: breaking it by worker id sent most requests of a lightly
    # loaded cluster to the lower id, which concentrated the caches as if the router knew where chunks were.
    return min(drawn, key=lambda worker: _busyness(loads[worker]))
