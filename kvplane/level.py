"""One level of a tiered store: a tier, its eviction policy and its counters."""
import logging
import threading
from collections.abc import Callable

import torch

from kvplane.codec import CodecError
from kvplane.policy import EvictionPolicy
from kvplane.stats import TierStats
from kvplane.tier import LabelledTier, Tier, TierError

PlacementListener = Callable[[str, str, int], None]
"""Told (key, tier name, bytes) when a tier gains a key, and (key, tier name, 0) when it loses one."""

_log = logging.getLogger(__name__)


class Level:
    """Admission, counters and listener events around one tier; a TierError reads as absence."""

    # Policy state and counters are guarded by `lock`; tier I/O runs outside it.

    def __init__(self, tier: Tier, policy: EvictionPolicy, listener: PlacementListener) -> None:
        self.tier = tier
        self.policy = policy
        self.stats = TierStats()
        self.lock = threading.Lock()
        self._listener = listener

    @property
    def name(self) -> str:
        """The tier's name."""
        return self.tier.name

    def place(self, key: str, blob: torch.Tensor, priority: float) -> tuple[bool, list[str]]:
        """Offer `blob` through the policy: whether the tier holds it now, and the keys it evicted."""
        with self.lock:
            if self.policy.contains(key):
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
            self.count_error(err)
            return False, victims
        with self.lock:
            self.stats.bytes_written += blob.numel()
        self._listener(key, self.name, blob.numel())
        return True, victims

    def fetch(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Bytes `[start, end)` of `key`, or None if absent or the backend failed."""
        try:
            return self.tier.read(key, start, end)
        except TierError as err:
            self.count_error(err)
            return None

    def hit_label(self) -> str:
        """The tier that served this thread's last whole-blob fetch: an inner tier's name, else this one's."""
        inner = self.tier.hit_label() if isinstance(self.tier, LabelledTier) else None
        return inner or self.name

    def label_of(self, key: str) -> str | None:
        """The tier holding `key` (an inner tier's name for a tier over tiers), or None."""
        if isinstance(self.tier, LabelledTier):
            try:
                return self.tier.label_of(key)
            except TierError as err:
                self.count_error(err)
                return None
        return self.name if self.holds(key) else None

    def holds(self, key: str) -> bool:
        """Whether the policy or, failing that, the tier itself knows `key`."""
        with self.lock:
            if self.policy.contains(key):
                return True
        try:
            return self.tier.contains(key)
        except TierError as err:
            self.count_error(err)
            return False

    def scan(self, prefix: str) -> list[tuple[str, int]]:
        """Keys with `prefix` and their sizes (none if the backend failed)."""
        try:
            return list(self.tier.scan(prefix))
        except TierError as err:
            self.count_error(err)
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
