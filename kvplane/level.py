"""One level of a tiered store: a tier, its eviction policy and its counters."""
import logging
import threading
from collections.abc import Callable

import torch

from kvplane.codec import CodecError, read_header, recompress
from kvplane.compression.base import CompressionError
from kvplane.compression.registry import NONE, compression
from kvplane.compression.verdicts import CompressionGate, OpenGate
from kvplane.eviction.policy import EvictionPolicy
from kvplane.stats import TierStats
from kvplane.tiers.breaker import Breaker
from kvplane.tiers.tier import Tier, TierError

PlacementListener = Callable[[str, str, int], None]
"""Told (key, tier name, bytes) when a tier gains a key, and (key, tier name, 0) when it loses one."""

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
        if not self._writes.allows():
            with self.lock:
                self.stats.skipped += 1
            return False, []
        with self.lock:
            if self.policy.contains(key):
                return True, []
        blob = self._compressed(key, blob)  # outside the lock: compressing a chunk takes milliseconds
        with self.lock:
            if self.policy.contains(key):  # placed by another thread meanwhile
                return True, []
            victims = self.policy.admit(key, blob.numel(), priority)
            admitted = key not in victims
            self.stats.rejections += not admitted
            self.stats.evictions += len(victims) - (not admitted)
        victims = [victim for victim in victims if victim != key]
        if not admitted:
            return False, victims
        try:
            self.tier.put(key, blob)
        except TierError as err:
            with self.lock:
                self.policy.remove(key)
            self._failed(self._writes, "writes", err)
            return False, victims
        self._succeeded(self._writes, "writes")
        with self.lock:
            self.stats.bytes_written += blob.numel()
        self._listener(key, self.name, blob.numel())
        return True, victims

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
        if not self._reads.allows():
            with self.lock:
                self.stats.skipped += 1
            return None
        try:
            data = self.tier.read(key, start, end)
        except TierError as err:
            self._failed(self._reads, "reads", err)
            return None
        self._succeeded(self._reads, "reads")
        if data is None:
            self._check_vanished(key)
        return data

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
