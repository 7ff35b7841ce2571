"""One level of a tiered store: a tier, its eviction policy and its counters."""
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import torch

from kvplane.codec import CodecError, read_header, recompress
from kvplane.compression.base import CompressionError
from kvplane.compression.registry import NONE, compression
from kvplane.compression.verdicts import CompressionGate, OpenGate
from kvplane.eviction.policy import EvictionPolicy
from kvplane.stats import TierStats
from kvplane.tiers.breaker import Breaker
from kvplane.tiers.tier import BatchedTier, Tier, TierError

PlacementListener = Callable[[str, str, int], None]
"""Told (key, tier name, bytes) when a tier gains a key, and (key, tier name, 0) when it loses one."""

R = TypeVar("R")  # what a guarded read returns per key

_log = logging.getLogger(__name__)


class Level:
    """Admission, counters and listener events around one tier; a TierError reads as absence."""

    # Policy state and counters are guarded by `lock`; tier I/O runs outside it. Reads and writes each
    # have a breaker: a tier that fails (an endpoint gone, a full disk) is skipped for a growing backoff
    # instead of costing every request a timeout. An entry the policy holds but the tier has lost (deleted
    # behind the store's back) is forgotten when a read finds it gone, so the next write puts it back.
    # A level with a compression compresses what reaches it uncompressed; an entry already compressed
    # is kept as it is wherever it goes (inflating it would take room and restore nothing).

    def __init__(
        self,
        tier: Tier,
        policy: EvictionPolicy,
        listener: PlacementListener,
        compression_name: str = NONE,
        gate: CompressionGate | None = None,
    ) -> None:
        self.tier = tier
        self.policy = policy
        self.compression = compression(compression_name).name
        self._gate = gate or OpenGate()
        self.stats = TierStats()
        self.lock = threading.Lock()
        self._listener = listener
        self._reads = Breaker()
        self._writes = Breaker()
        # A tier with batched calls writes an admitted batch in one of them; any other tier, key by key.
        batched = isinstance(tier, BatchedTier)
        self._write = self._write_batch if batched else self._write_each
        self._contains_many = cast(BatchedTier, tier).contains_many if batched else self._contains_each
        self._labels_of = cast(BatchedTier, tier).labels_of if batched else self._labels_each
        self._read_whole_many = cast(BatchedTier, tier).read_whole_many if batched else self._read_whole_each

    @property
    def name(self) -> str:
        """The tier's name."""
        return self.tier.name

    @property
    def reads_whole(self) -> bool:
        """Whether a read costs a round trip, so a chunk's layers come from one read."""
        return self.tier.reads_whole

    @property
    def is_down(self) -> bool:
        """Whether the last read or write of this tier failed (it is skipped until its backoff ends)."""
        return self._reads.tripped or self._writes.tripped

    def place(self, key: str, blob: torch.Tensor, priority: float) -> tuple[bool, list[str]]:
        """Offer `blob` through the policy: whether the tier holds it now, and the keys it evicted."""
        return self.place_many([(key, blob, priority)])[0]

    def place_many(self, items: Sequence[tuple[str, torch.Tensor, float]]) -> list[tuple[bool, list[str]]]:
        """`place` of each `(key, blob, priority)`; the admitted ones written together where the tier allows."""
        if not self._writes.allows():
            with self.lock:
                self.stats.skipped += len(items)
            return [(False, [])] * len(items)
        placed: list[tuple[bool, list[str]]] = []
        admitted: list[tuple[int, str, torch.Tensor]] = []
        for key, blob, priority in items:
            held, to_write, victims = self._admit(key, blob, priority)
            if to_write is not None:
                admitted.append((len(placed), key, to_write))
            placed.append((held, victims))
        for index, written in self._write([(key, blob) for _, key, blob in admitted]):
            slot = admitted[index][0]
            placed[slot] = (written, placed[slot][1])
        return placed

    def _admit(
        self, key: str, blob: torch.Tensor, priority: float
    ) -> tuple[bool, torch.Tensor | None, list[str]]:
        """Whether the tier holds `key` already, the blob to write (as kept here) if the policy admits it, and the
        keys the admission evicted."""
        with self.lock:
            if self.policy.contains(key):
                return True, None, []
        blob = self._compressed(key, blob)  # outside the lock: compressing a chunk takes milliseconds
        with self.lock:
            if self.policy.contains(key):  # placed by another thread meanwhile
                return True, None, []
            victims = self.policy.admit(key, blob.numel(), priority)
            admitted = key not in victims
            self.stats.rejections += not admitted
            self.stats.evictions += len(victims) - (not admitted)
        return False, (blob if admitted else None), [victim for victim in victims if victim != key]

    def _write_each(self, items: list[tuple[str, torch.Tensor]]) -> list[tuple[int, bool]]:
        """Write admitted blobs one call each; (index, whether written) for each."""
        return [(index, self._write_batch([item])[0][1]) for index, item in enumerate(items)]

    def _write_batch(self, items: list[tuple[str, torch.Tensor]]) -> list[tuple[int, bool]]:
        """Write admitted blobs in one tier call; a failure un-admits them all."""
        if not items:
            return []
        try:
            if len(items) == 1:
                self.tier.put(*items[0])
            else:
                cast(BatchedTier, self.tier).put_many(items)  # only a batched tier is handed several
        except TierError as err:
            with self.lock:
                for key, _ in items:
                    self.policy.remove(key)
            self._failed(self._writes, "writes", err)
            return [(index, False) for index in range(len(items))]
        self._succeeded(self._writes, "writes")
        with self.lock:
            self.stats.bytes_written += sum(blob.numel() for _, blob in items)
        for key, blob in items:
            self._listener(key, self.name, blob.numel())
        return [(index, True) for index in range(len(items))]

    def _compressed(self, key: str, blob: torch.Tensor) -> torch.Tensor:
        """`blob` compressed as this level keeps entries (as it is when it is compressed already, or cannot be)."""
        if self.compression == NONE:
            return blob
        header = read_header(blob)
        if header.compression != NONE:
            return blob
        if not self._gate.allows(header.fingerprint, self.compression):
            with self.lock:
                self.stats.codec_refused += 1
            return blob
        try:
            compressed = recompress(blob, self.compression)
        except CompressionError as err:
            _log.warning("kvplane: tier %s keeps %s uncompressed: %s", self.name, key, err)
            with self.lock:
                self.stats.uncompressible += 1
            return blob
        with self.lock:
            self.stats.compressed += 1
        return compressed

    def fetch(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Bytes `[start, end)` of `key`, or None if absent, the backend failed or the tier is skipped."""
        return self._guarded_read([key], lambda: [self.tier.read(key, start, end)])[0]

    def fetch_whole_many(self, keys: Sequence[str]) -> list[tuple[torch.Tensor, str] | None]:
        """Each key's whole blob and the tier that served it (an inner tier's name), one call where the tier allows."""
        return self._guarded_read(keys, lambda: self._read_whole_many(keys))

    def _guarded_read(self, keys: Sequence[str], read: Callable[[], list[R | None]]) -> list[R | None]:
        """`read()` of `keys` under the reads' breaker: all None when the tier is skipped or its backend fails;
        a key found absent is checked for having vanished behind the store's back."""
        if not self._reads.allows():
            with self.lock:
                self.stats.skipped += 1
            return [None] * len(keys)
        try:
            found = read()
        except TierError as err:
            self._failed(self._reads, "reads", err)
            return [None] * len(keys)
        self._succeeded(self._reads, "reads")
        for key, hit in zip(keys, found):
            if hit is None:
                self._check_vanished(key)
        return found

    def _read_whole_each(self, keys: Sequence[str]) -> list[tuple[torch.Tensor, str] | None]:
        found: list[tuple[torch.Tensor, str] | None] = []
        for key in keys:
            data = self.tier.read(key)
            found.append(None if data is None else (data, self.tier.hit_label() or self.name))
        return found

    def hit_label(self) -> str:
        """The tier that served this thread's last whole-blob fetch: an inner tier's name, else this one's."""
        return self.tier.hit_label() or self.name

    def stream_label(self, key: str) -> str:
        """The tier a stream of `key` from this level is served by: the inner tier for a tier over tiers."""
        # One more call to the home shard per chunk, so that a shard read says local (ram, ssd) or remote.
        return self._inner_label(key) or self.name

    def label_of(self, key: str) -> str | None:
        """The tier holding `key` (an inner tier's name for a tier over tiers), or None."""
        label = self._inner_label(key)
        if label != self.name:
            return label
        return self.name if self.holds(key) else None

    def _inner_label(self, key: str) -> str | None:
        """The tier's own answer: an inner tier's name or None for a tier over tiers, this one's name for others."""
        try:
            return self.tier.label_of(key)
        except TierError as err:
            self.count_error(err)
            return None

    def labels_of(self, keys: Sequence[str]) -> list[str | None]:
        """`label_of` of each key, in one tier call where the tier allows."""
        try:
            inner = self._labels_of(keys)
        except TierError as err:
            self.count_error(err)
            inner = [None] * len(keys)
        own = [i for i, label in enumerate(inner) if label == self.name]
        held = self.holds_many([keys[i] for i in own])
        for i, is_held in zip(own, held):
            inner[i] = self.name if is_held else None
        return inner

    def holds_many(self, keys: Sequence[str]) -> list[bool]:
        """`holds` of each key; the keys the policy does not know asked of the tier in one call where it allows."""
        with self.lock:
            held = [self.policy.contains(key) for key in keys]
        unknown = [i for i, is_held in enumerate(held) if not is_held]
        if unknown and self._reads.allows():
            try:
                found = self._contains_many([keys[i] for i in unknown])
            except TierError as err:
                self._failed(self._reads, "reads", err)
                found = [False] * len(unknown)
            for i, present in zip(unknown, found):
                held[i] = present is True
        return held

    def _contains_each(self, keys: Sequence[str]) -> list[bool]:
        return [self.tier.contains(key) for key in keys]

    def _labels_each(self, keys: Sequence[str]) -> list[str | None]:
        return [self.tier.label_of(key) for key in keys]

    def holds(self, key: str) -> bool:
        """Whether the policy or, failing that, the tier itself knows `key`."""
        with self.lock:
            if self.policy.contains(key):
                return True
        return self._tier_contains(key) is True

    def present(self, key: str) -> bool:
        """Whether the tier really has `key` (asked even when the policy knows it; a lost entry is forgotten)."""
        found = self._tier_contains(key)
        if found is False:
            self._check_vanished(key)
        return found is True

    def adopt(self, key: str, nbytes: int) -> list[str]:
        """Take an entry the tier already holds into the policy and report it; returns the keys to evict."""
        with self.lock:
            victims = self.policy.admit(key, nbytes, 1.0)
        if key not in victims:
            self._listener(key, self.name, nbytes)
        return victims

    def scan(self, prefix: str) -> list[tuple[str, int]]:
        """Keys with `prefix` and their sizes (none if the backend failed)."""
        if not self._reads.allows():
            return []
        try:
            return list(self.tier.scan(prefix))
        except TierError as err:
            self._failed(self._reads, "reads", err)
            return []

    def forget(self, key: str) -> None:
        """Remove `key` from the policy and the tier."""
        with self.lock:
            self.policy.remove(key)
        self.drop(key)

    def drop(self, key: str) -> None:
        """Delete `key` from the tier (the policy has let it go already)."""
        try:
            self.tier.delete(key)
        except TierError as err:
            self.count_error(err)
            return
        self._listener(key, self.name, 0)

    def discard(self, key: str, err: CodecError) -> None:
        """Delete an entry that failed to decode, so it is never read again."""
        _log.warning("kvplane: dropping bad entry %s from tier %s: %s", key, self.name, err)
        with self.lock:
            self.stats.corruptions += 1
        self.forget(key)

    def count_error(self, err: TierError) -> None:
        """Record a backend failure."""
        _log.warning("kvplane: tier %s failed: %s", self.name, err)
        with self.lock:
            self.stats.errors += 1

    def _tier_contains(self, key: str) -> bool | None:
        """The tier's answer, or None when it cannot be asked now."""
        if not self._reads.allows():
            return None
        try:
            return self.tier.contains(key)
        except TierError as err:
            self._failed(self._reads, "reads", err)
            return None

    def _check_vanished(self, key: str) -> None:
        """A read found nothing: if the policy thought the tier held `key`, it was lost behind the store's back."""
        with self.lock:
            if not self.policy.contains(key):
                return
            self.policy.remove(key)
            self.stats.vanished += 1
        _log.warning("kvplane: %s vanished from tier %s; forgotten, so the next write puts it back", key, self.name)
        self._listener(key, self.name, 0)

    def _failed(self, breaker: Breaker, calls: str, err: TierError) -> None:
        backoff_s = breaker.failed()
        _log.warning("kvplane: tier %s failed (%s); skipping its %s for %.0f s", self.name, err, calls, backoff_s)
        with self.lock:
            self.stats.errors += 1

    def _succeeded(self, breaker: Breaker, calls: str) -> None:
        if breaker.succeeded():
            _log.warning("kvplane: tier %s %s work again", self.name, calls)
