"""Pick a worker for a request: cache affinity first, rendezvous home when cold, power-of-two when loaded."""
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from scheduler.balance import ImbalanceRule, power_of_two
from scheduler.load import WorkerLoad
from scheduler.rendezvous import home_worker
from scheduler.scoring import Chunk, Locations, score_workers, worker_views
from scheduler.weights import RouterWeights


class RouteReason(StrEnum):
    """Why the router chose a worker (a metrics label)."""

    SCORE = "score"
    COLD = "cold"
    BALANCE = "balance"
    SATURATED = "saturated"


@dataclass(frozen=True, slots=True)
class Route:
    """The chosen worker and why."""

    worker_id: str
    reason: RouteReason


class Router:
    """Stateless apart from its RNG: every call gets the current location view and loads."""

    def __init__(
        self,
        weights: RouterWeights | None = None,
        imbalance: ImbalanceRule | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._weights = weights or RouterWeights()
        self._imbalance = imbalance or ImbalanceRule()
        self._rng = rng or random.Random()

    def route(self, chunks: Sequence[Chunk], locations: Locations, loads: Mapping[str, WorkerLoad]) -> Route:
        """Choose among the live workers (the keys of `loads`); `locations` maps key -> {worker: tier}."""
        if not loads:
            raise ValueError("loads must name at least one live worker, got none")
        preferred = self._preferred(chunks, locations, loads)
        if preferred is not None and not self._imbalance.overloaded(preferred.worker_id, loads):
            return preferred
        open_workers = [worker for worker, load in loads.items() if not load.is_full]
        if not open_workers:
            # Nowhere has room: keep the locality choice and let admission answer with Retry-After.
            fallback = preferred.worker_id if preferred else min(loads, key=lambda w: (loads[w].num_queued, w))
            return Route(fallback, RouteReason.SATURATED)
        return Route(power_of_two(open_workers, loads, self._rng), RouteReason.BALANCE)

    def _preferred(
        self, chunks: Sequence[Chunk], locations: Locations, loads: Mapping[str, WorkerLoad]
    ) -> Route | None:
        """Best-scored worker when some chunk is cached; the first chunk's home when none is; None without chunks."""
        if not chunks:
            return None
        scores = score_workers(chunks, worker_views(locations, loads.keys()), loads, self._weights)
        if any(score.affinity_bytes > 0 for score in scores):
            return Route(scores[0].worker_id, RouteReason.SCORE)
        # Sending every cold request for a chunk to the same home is what lets locality build up.
        return Route(home_worker(chunks[0].key, loads), RouteReason.COLD)
