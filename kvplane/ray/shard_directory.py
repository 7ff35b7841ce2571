"""The live node shards, and each key's home among them."""
import logging
import threading
from collections.abc import Mapping

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError

from kvplane.ray.namespace import named_actors
from kvplane.ray.shard import SHARD_NAME_PREFIX, ShardConfig, ensure_local_shard, shard_name
from kvplane.rendezvous import home_shard

IDENTITY_TIMEOUT_S = 5.0

_log = logging.getLogger(__name__)


class ShardDirectory:
    """Live KVShard handles by name; a dead shard leaves the hashing and the location index."""

    # Keys hash to a shard's stable identity (its SSD folder's name), not its actor name, which carries
    # the Ray node id: after a Ray restart the same keys find the same node's entries. With `keep_local`,
    # `refresh` starts this node's shard again if it is gone for good (killed without a restart).

    def __init__(
        self,
        shards: Mapping[str, ActorHandle],
        index: ActorHandle | None = None,
        keep_local: ShardConfig | None = None,
    ) -> None:
        self._index = index
        self._keep_local = keep_local
        self._lock = threading.Lock()
        self._identities: dict[str, str] = {}
        self._live: dict[str, ActorHandle] = {}
        self._names: dict[str, str] = {}  # hashed identity -> shard name, for the live shards
        self._set_live(self._with_identities(dict(shards)))

    @classmethod
    def discover(cls, index: ActorHandle | None = None, keep_local: ShardConfig | None = None) -> "ShardDirectory":
        """The shards registered under their names in blendserve's Ray namespace."""
        return cls(_registered_shards(), index, keep_local)

    def refresh(self) -> None:
        """Re-read the registered shards: new nodes join, restarted shards return, dead ones leave."""
        shards = _registered_shards()
        if self._keep_local is not None:
            local = shard_name(ray.get_runtime_context().get_node_id())
            if local not in shards:
                _log.warning("kvplane: shard %s is gone; starting it again", local)
                shards[local] = ensure_local_shard(self._keep_local, self._index)
        self._set_live(self._with_identities(shards))

    def home(self, key: str) -> tuple[str, ActorHandle] | None:
        """The live shard `key` belongs to, by name and handle, or None when no shard is live."""
        with self._lock:
            identity = home_shard(key, self._names)
            if identity is None:
                return None
            name = self._names[identity]
            return name, self._live[name]

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
            live = dict(self._live)
        gone = live.pop(name, None) is not None
        self._set_live(live)
        if gone:
            _log.warning("kvplane: shard %s is unreachable; its keys now hash to the next shard", name)
            if self._index is not None:
                self._index.drop_holder.remote(name)

    def _set_live(self, shards: dict[str, ActorHandle]) -> None:
        identities = [self._identities[name] for name in shards]
        # Identities are unique by construction; should two ever clash, their names keep them apart.
        names = {
            identity if identities.count(identity) == 1 else name: name for name, identity in zip(shards, identities)
        }
        with self._lock:
            self._live, self._names = shards, names

    def _with_identities(self, shards: dict[str, ActorHandle]) -> dict[str, ActorHandle]:
        """The shards whose stable identity is known (asked once per name); one that does not answer is left out."""
        known = {}
        for name, shard in shards.items():
            if name not in self._identities:
                try:
                    self._identities[name] = ray.get(shard.describe.remote(), timeout=IDENTITY_TIMEOUT_S)["identity"]
                except (RayActorError, GetTimeoutError):
                    _log.warning("kvplane: shard %s does not answer; left out until it does", name)
                    continue
            known[name] = shard
        return known


def _registered_shards() -> dict[str, ActorHandle]:
    return named_actors(SHARD_NAME_PREFIX)
