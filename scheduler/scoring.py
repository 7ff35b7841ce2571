"""Cache-affinity score per worker: tier-weighted cached bytes of the request's chunks minus load."""
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from kvplane.checks import check, check_count
from scheduler.load import WorkerLoad
from scheduler.weights import RouterWeights

Locations = Mapping[str, Mapping[str, str]]
"""key -> {worker_id: tier}: where each chunk can be reached (the location index's view)."""

WorkerView = Mapping[str, str]
"""key -> tier: the chunks one worker can reach and the fastest tier it reaches each in."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One retrieved chunk of a request: its content key and the size of its KV."""

    key: str
    num_bytes: int

    def __post_init__(self) -> None:
        check(bool(self.key), "key", "a non-empty string", self.key)
        check_count("num_bytes", self.num_bytes, 0)


@dataclass(frozen=True, slots=True)
class WorkerScore:
    """A worker's affinity for a request, its load penalty, both in (weighted) bytes."""

    worker_id: str
    affinity_bytes: float
    penalty_bytes: float

    @property
    def score(self) -> float:
        """Affinity minus penalty: higher is better."""
        return self.affinity_bytes - self.penalty_bytes


def worker_views(locations: Locations, workers: Collection[str]) -> dict[str, dict[str, str]]:
    """Turn key -> {worker: tier} into worker -> {key: tier} for `workers` (others are not live)."""
    views: dict[str, dict[str, str]] = {worker: {} for worker in workers}
    for key, placements in locations.items():
        for worker, tier in placements.items():
            if worker in views:
                views[worker][key] = tier
    return views


def score_workers(
    chunks: Sequence[Chunk],
    views: Mapping[str, WorkerView],
    loads: Mapping[str, WorkerLoad],
    weights: RouterWeights,
) -> list[WorkerScore]:
    """Score every worker in `loads`, best first; equal scores fall back to worker id order."""
    # A chunk repeated in one prompt is loaded once, so its bytes count once.
    sizes = {chunk.key: chunk.num_bytes for chunk in chunks}
    scores = []
    for worker, load in loads.items():
        view = views.get(worker, {})
        affinity = sum(num_bytes * weights.tier_weight(view[key]) for key, num_bytes in sizes.items() if key in view)
        scores.append(WorkerScore(worker, affinity, weights.penalty_bytes(load)))
    return sorted(scores, key=lambda s: (-s.score, s.worker_id))
