"""Which holder (a worker or a node shard) keeps which chunk keys in which tier; the scheduler reads it."""
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import ray
from ray.actor import ActorHandle

from kvplane.ray.namespace import RAY_NAMESPACE, was_restarted

INDEX_ACTOR_NAME = "kvplane-location-index"

_log = logging.getLogger(__name__)

PlacementEvent = tuple[str, str, int]
"""(key, tier, bytes); bytes = 0 means the tier no longer holds the key."""


@dataclass(slots=True, frozen=True)
class Location:
    """One copy of a chunk: who holds it, in which tier, and its size."""

    holder: str
    tier: str
    nbytes: int


class LocationIndex:
    """Placements reported by stores, queryable by key or summed per holder for routing."""

    def __init__(self) -> None:
        self._copies: dict[str, dict[tuple[str, str], int]] = {}
        self._keys_by_holder: dict[str, set[str]] = defaultdict(set)
        self._started_s = time.monotonic()
        self._epoch = uuid.uuid4().hex  # new at every start: holders that see it change report everything again
        self._restarted = was_restarted()
        if self._restarted:
            _log.warning("kvplane: the location index restarted empty; placements refill it as they happen")

    def apply(self, holder: str, events: Sequence[PlacementEvent]) -> None:
        """Record a batch of placement events from `holder`, in order."""
        for key, tier, nbytes in events:
            copies = self._copies.setdefault(key, {})
            if nbytes > 0:
                copies[(holder, tier)] = nbytes
                self._keys_by_holder[holder].add(key)
                continue
            copies.pop((holder, tier), None)
            if not copies:
                del self._copies[key]
            if not any(h == holder for h, _ in copies):
                self._keys_by_holder[holder].discard(key)

    def lookup(self, keys: Iterable[str]) -> dict[str, list[Location]]:
        """Every known copy of each key (keys with none map to an empty list)."""
        return {
            key: [Location(holder, tier, n) for (holder, tier), n in self._copies.get(key, {}).items()] for key in keys
        }

    def cached_bytes(self, keys: Iterable[str]) -> dict[str, dict[str, int]]:
        """Bytes of `keys` each holder keeps, per tier: the router's cache-affinity input."""
        totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for key in keys:
            for (holder, tier), nbytes in self._copies.get(key, {}).items():
                totals[holder][tier] += nbytes
        return {holder: dict(tiers) for holder, tiers in totals.items()}

    def drop_holder(self, holder: str) -> int:
        """Forget everything `holder` reported (it died); returns how many keys it held."""
        keys = self._keys_by_holder.pop(holder, set())
        for key in keys:
            copies = self._copies.get(key, {})
            for place in [place for place in copies if place[0] == holder]:
                del copies[place]
            if not copies:
                self._copies.pop(key, None)
        return len(keys)

    def holders(self) -> list[str]:
        """Holders with at least one key."""
        return [holder for holder, keys in self._keys_by_holder.items() if keys]

    def epoch(self) -> str:
        """An id of this start of the index."""
        return self._epoch

    def describe(self) -> dict[str, float]:
        """Whether Ray restarted it (it comes back empty), its uptime, and how many keys it knows."""
        return {"restarted": float(self._restarted), "uptime_s": time.monotonic() - self._started_s,
                "keys": float(len(self._copies))}


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class LocationIndexActor(LocationIndex):
    """Ray actor shell over LocationIndex, named INDEX_ACTOR_NAME; restarted empty if it dies (events refill it)."""


def launch_location_index() -> ActorHandle:
    """The cluster's location index actor, started (detached, outliving its starter) if it is not running yet."""
    options = {"name": INDEX_ACTOR_NAME, "namespace": RAY_NAMESPACE, "get_if_exists": True, "lifetime": "detached"}
    return LocationIndexActor.options(**options).remote()
