"""The node shards seen as one tier of a worker's store."""
from collections.abc import Callable, Iterator
from typing import Any

import ray
import torch
from ray import ObjectRef
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError

from kvplane.buffers import owned_blob
from kvplane.shard_directory import ShardDirectory

_UNREACHABLE = object()


class ShardTier:
    """Keys live on their rendezvous home shard; a dead shard is a miss, and writes move on."""

    def __init__(
        self, directory: ShardDirectory, name: str = "shard", capacity_bytes: int = 1 << 62, timeout_s: float = 30.0
    ) -> None:
        self.name = name
        # The shards enforce their own budgets; this figure only satisfies the Tier shape.
        self.capacity_bytes = capacity_bytes
        self._directory = directory
        self._timeout_s = timeout_s

    def put(self, key: str, blob: torch.Tensor) -> None:
        """Store on the key's home shard (the next one if it turns out dead)."""
        payload = blob.cpu().numpy()
        while (home := self._directory.home(key)) is not None:
            if self._call(home, lambda shard: shard.put.remote(key, payload)) is not _UNREACHABLE:
                return

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Bytes from the home shard, copied once out of the read-only object-store view."""
        data = self._call_home(key, lambda shard: shard.read.remote(key, start, end))
        return None if data is None or data is _UNREACHABLE else owned_blob(data)

    def delete(self, key: str) -> None:
        """Remove from the home shard."""
        self._call_home(key, lambda shard: shard.delete.remote(key))

    def contains(self, key: str) -> bool:
        """Whether the home shard holds `key`."""
        return self._call_home(key, lambda shard: shard.contains.remote(key)) is True

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Keys with `prefix` on every live shard."""
        for home in self._directory.live().items():
            found = self._call(home, lambda shard: shard.scan.remote(prefix))
            if found is not _UNREACHABLE:
                yield from found

    def _call_home(self, key: str, call: Callable[[ActorHandle], ObjectRef]) -> Any:
        home = self._directory.home(key)
        return _UNREACHABLE if home is None else self._call(home, call)

    def _call(self, home: tuple[str, ActorHandle], call: Callable[[ActorHandle], ObjectRef]) -> Any:
        name, shard = home
        try:
            return ray.get(call(shard), timeout=self._timeout_s)
        except (RayActorError, GetTimeoutError):
            self._directory.mark_dead(name)
            return _UNREACHABLE
