"""The routing policies cache-affinity routing is measured against: round robin and power-of-two choices."""
import random
from collections.abc import Mapping, Sequence
from typing import Protocol

from scheduler.balance import power_of_two
from scheduler.load import WorkerLoad
from scheduler.router import Route, Router, RouteReason
from scheduler.scoring import Chunk, Locations
from scheduler.weights import RouterWeights

AFFINITY, POWER_OF_TWO, ROUND_ROBIN = "affinity", "power_of_two", "round_robin"
ROUTING_POLICIES = (AFFINITY, POWER_OF_TWO, ROUND_ROBIN)


class RoutingPolicy(Protocol):
    """What the gateway asks of a router."""

    def route(self, chunks: Sequence[Chunk], locations: Locations, loads: Mapping[str, WorkerLoad]) -> Route:
        """The worker for a request with `chunks`, given where they are cached and every live worker's load."""


class RoundRobinRouter:
    """Live workers in turn (id order), blind to cache and load."""

    def __init__(self) -> None:
        self._next = 0

    def route(self, chunks: Sequence[Chunk], locations: Locations, loads: Mapping[str, WorkerLoad]) -> Route:
        """The next worker in id order."""
        if not loads:
            raise ValueError("loads must name at least one live worker, got none")
        workers = sorted(loads)
        worker = workers[self._next % len(workers)]
        self._next += 1
        return Route(worker, RouteReason.BALANCE)


class PowerOfTwoRouter:
    """The less busy of two random workers with room (any two when all are full), blind to the cache."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def route(self, chunks: Sequence[Chunk], locations: Locations, loads: Mapping[str, WorkerLoad]) -> Route:
        """scheduler.balance.power_of_two over the open workers."""
        if not loads:
            raise ValueError("loads must name at least one live worker, got none")
        open_workers = [w for w, load in loads.items() if not load.is_full] or list(loads)
        return Route(power_of_two(open_workers, loads, self._rng), RouteReason.BALANCE)


def make_router(policy: str, weights: RouterWeights | None = None, seed: int | None = None) -> RoutingPolicy:
    """A router by policy name: the cache-affinity `Router`, or one of the two cache-blind baselines."""
    rng = random.Random(seed)
    if policy == AFFINITY:
        return Router(weights, rng=rng)
    if policy == POWER_OF_TWO:
        return PowerOfTwoRouter(rng)
    if policy == ROUND_ROBIN:
        return RoundRobinRouter()
    raise ValueError(f"policy must be one of {ROUTING_POLICIES}, got {policy!r}")
