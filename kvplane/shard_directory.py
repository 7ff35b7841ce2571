"""The live node shards, and each key's home among them."""
import logging
import threading
from collections.abc import Mapping

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError

from kvplane.namespace import named_actors
from kvplane.rendezvous import home_shard
from kvplane.shard import SHARD_NAME_PREFIX

_log = logging.getLogger(__name__)


class ShardDirectory:
    """Live KVShard handles by name; a dead shard leaves the hashing and the location index."""

    def __init__(self, shards: Mapping[str, ActorHandle], index: ActorHandle | None = None) -> None:
        self._live = dict(shards)
        self._index = index
        self._lock = threading.Lock()

    @classmethod
    def discover(cls, index: ActorHandle | None = None) -> "ShardDirectory":
        """The shards registered under their names in blendserve's Ray namespace."""
        return cls(_registered_shards(), index)

    def refresh(self) -> None:
        """Re-read the registered shards: new nodes join, restarted shards return, dead ones leave."""
        shards = _registered_shards()
        with self._lock:
            self._live = shards

    def home(self, key: str) -> tuple[str, ActorHandle] | None:
        """The live shard `key` belongs to, by name and handle, or None when no shard is live."""
        with self._lock:
            name = home_shard(key, self._live)
            return None if name is None else (name, self._live[name])

    def live(self) -> dict[str, ActorHandle]:
        """Live shards by name."""
        with self._lock:
            return dict(self._live)

    def invalidate(self, fingerprint: str) -> int:
        """Remove a fingerprint's chunks from every live shard (wherever hashing put them); returns the count."""
        removed = 0
        for name, shard in self.live().items():
            try:
                removed += ray.get(shard.invalidate.remote(fingerprint))
            except RayActorError:
                self.mark_dead(name)
        return removed

    def mark_dead(self, name: str) -> None:
        """Take a shard out of the hashing after a failed call."""
        with self._lock:
            gone = self._live.pop(name, None) is not None
        if gone:
            _log.warning("kvplane: shard %s is unreachable; its keys now hash to the next shard", name)
            if self._index is not None:
                self._index.drop_holder.remote(name)


def _registered_shards() -> dict[str, ActorHandle]:
    return named_actors(SHARD_NAME_PREFIX)
