"""The node shards seen as one tier of a worker's store."""
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ray
import torch
from ray import ObjectRef
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError

from kvplane.buffers import owned_blob
from kvplane.ray.shard import shard_name
from kvplane.ray.shard_directory import ShardDirectory

_UNREACHABLE = object()
REMOTE = "remote"
# A call slower than this (a hung or overloaded shard) counts as a miss and takes the shard out of the
# hashing until the next refresh; a chunk's layer reads take milliseconds.
SHARD_CALL_TIMEOUT_S = 5.0


class ShardTier:
    """Keys live on their rendezvous home shard; a dead shard is a miss, and writes move on."""

    # Reads are labelled with the shard's own tier (ram, ssd) when the shard is on this node, else "remote".

    reads_whole = True  # every read is a Ray call to the shard actor

    def __init__(
        self,
        directory: ShardDirectory,
        name: str = "shard",
        capacity_bytes: int = 1 << 62,
        timeout_s: float = SHARD_CALL_TIMEOUT_S,
        local_node_id: str | None = None,
    ) -> None:
        self.name = name
        # The shards enforce their own budgets; this figure only satisfies the Tier shape.
        self.capacity_bytes = capacity_bytes
        self._directory = directory
        self._timeout_s = timeout_s
        self._local_shard = None if local_node_id is None else shard_name(local_node_id)
        self._last_hit = threading.local()

    def put(self, key: str, blob: torch.Tensor) -> None:
        """Store on the key's home shard (the next one if it turns out dead)."""
        payload = blob.cpu().numpy()
        while (home := self._directory.home(key)) is not None:
            if self._call(home, lambda shard: shard.put.remote(key, payload)) is not _UNREACHABLE:
                return

    def put_many(self, items: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Store each blob on its key's home shard: one call per shard, all shards at once."""
        keys = [key for key, _ in items]
        payloads = [blob.cpu().numpy() for _, blob in items]
        pending = list(range(len(items)))
        while pending:  # the items of a shard found dead go to their keys' next home
            answers = self._call_homes(
                [keys[i] for i in pending],
                lambda shard, ids: shard.put_many.remote([keys[pending[i]] for i in ids],
                                                         [payloads[pending[i]] for i in ids]),
                timeout_per_key=True,
            )
            pending = [pending[i] for _, ids, answer in answers if answer is _UNREACHABLE for i in ids]

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key's home shard holds it: one call per shard."""
        found = [False] * len(keys)
        for _, ids, answer in self._call_homes(keys, lambda shard, ids: shard.contains_many.remote(
                [keys[i] for i in ids])):
            if answer is not _UNREACHABLE:
                for i, held in zip(ids, answer):
                    found[i] = held is True
        return found

    def labels_of(self, keys: Sequence[str]) -> list[str | None]:
        """`label_of` of each key: one call per shard."""
        labels: list[str | None] = [None] * len(keys)
        for name, ids, answer in self._call_homes(keys, lambda shard, ids: shard.locate_many.remote(
                [keys[i] for i in ids])):
            if answer is not _UNREACHABLE:
                for i, tier in zip(ids, answer):
                    labels[i] = None if tier is None else self._label(name, tier)
        return labels

    def read_whole_many(self, keys: Sequence[str]) -> list[tuple[torch.Tensor, str] | None]:
        """Each key's whole blob and the tier that served it: one call per shard, whose answer moves the bytes."""
        found: list[tuple[torch.Tensor, str] | None] = [None] * len(keys)
        for name, ids, answer in self._call_homes(keys, lambda shard, ids: shard.read_located_many.remote(
                [keys[i] for i in ids]), timeout_per_key=True):
            if answer is not _UNREACHABLE:
                for i, hit in zip(ids, answer):
                    if hit is not None:
                        found[i] = (owned_blob(hit[1]), self._label(name, hit[0]))
        return found

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Bytes from the home shard, copied once out of the read-only object-store view."""
        if start == 0 and end is None:
            return self._read_whole(key)
        data = self._call_home(key, lambda shard: shard.read.remote(key, start, end))
        return None if data is None or data is _UNREACHABLE else owned_blob(data)

    def sweep_temporaries(self, older_than_s: float) -> int:
        """Each shard sweeps its own tiers when it starts."""
        return 0

    def hit_label(self) -> str | None:
        """The tier that served this thread's last whole-chunk read."""
        return getattr(self._last_hit, "label", None)

    def label_of(self, key: str) -> str | None:
        """The home shard's tier holding `key` (or "remote" for another node's shard), or None."""
        home = self._directory.home(key)
        if home is None:
            return None
        tier = self._call(home, lambda shard: shard.locate.remote(key))
        return None if tier is None or tier is _UNREACHABLE else self._label(home[0], tier)

    def _read_whole(self, key: str) -> torch.Tensor | None:
        self._last_hit.label = None
        home = self._directory.home(key)
        found = None if home is None else self._call(home, lambda shard: shard.read_located.remote(key))
        if found is None or found is _UNREACHABLE:
            return None
        tier, data = found
        self._last_hit.label = self._label(home[0], tier)
        return owned_blob(data)

    def _label(self, shard: str, tier: str) -> str:
        return tier if self._local_shard is None or shard == self._local_shard else REMOTE

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
        return self._answer(name, call(shard))

    def _call_homes(
        self, keys: Sequence[str], call: Callable[[ActorHandle, list[int]], ObjectRef], timeout_per_key: bool = False
    ) -> list[tuple[str, list[int], Any]]:
        """`call(shard, indices of its keys)` sent to every home shard at once; (shard, indices, answer) for each."""
        # Keys with no live home are left out, as a single call to no shard is. A call that moves every key's
        # bytes (a batch of puts) may take the single call's time limit once per key before the shard counts as hung.
        groups: dict[str, tuple[ActorHandle, list[int]]] = {}
        for index, key in enumerate(keys):
            home = self._directory.home(key)
            if home is not None:
                groups.setdefault(home[0], (home[1], []))[1].append(index)
        sent = [(name, ids, call(shard, ids)) for name, (shard, ids) in groups.items()]
        return [(name, ids, self._answer(name, ref, self._timeout_s * (len(ids) if timeout_per_key else 1)))
                for name, ids, ref in sent]

    def _answer(self, name: str, ref: ObjectRef, timeout_s: float | None = None) -> Any:
        """The shard's answer, or _UNREACHABLE (the shard marked dead) when it failed or took too long."""
        try:
            return ray.get(ref, timeout=self._timeout_s if timeout_s is None else timeout_s)
        except (RayActorError, GetTimeoutError):
            self._directory.mark_dead(name)
            return _UNREACHABLE
