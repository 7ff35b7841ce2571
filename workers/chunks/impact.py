"""A chunk's context impact kept beside its KV: measured when it is first used in context, refined as it is reused.

Cache-Craft's Cache Context Impact (CCI) of a chunk depends on what precedes it, but a chunk's impact over its
uses is stable enough to act on before any layer is loaded: a chunk whose stored impact is low needs no
recompute (workers/fusion/cachecraft.py), and one that always needs heavy recompute is worth less to keep
(kvplane/eviction/impact_lfu.py). Every chunk store has an `impacts` ImpactBook, keyed like its chunks.
"""
import threading
from collections import OrderedDict
from dataclasses import dataclass

from kvplane.checks import check, check_count


@dataclass(frozen=True, slots=True)
class ChunkImpact:
    """The running mean of a chunk's measured context impact over the uses that measured it."""

    mean: float
    uses: int

    def __post_init__(self) -> None:
        check(0.0 <= self.mean <= 1.0, "mean", "in [0, 1]", self.mean)
        check_count("uses", self.uses, 1)

    def refined(self, value: float) -> "ChunkImpact":
        """This record with one more use that measured `value`."""
        uses = self.uses + 1
        return ChunkImpact(self.mean + (value - self.mean) / uses, uses)


class ImpactBook:
    """Impacts by chunk key; past `max_entries` the least recently measured is dropped; thread-safe."""

    def __init__(self, max_entries: int = 1 << 20) -> None:
        check_count("max_entries", max_entries, 1)
        self.max_entries = max_entries
        self._entries: OrderedDict[str, ChunkImpact] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> ChunkImpact | None:
        """The chunk's impact so far, or None before any use measured it."""
        with self._lock:
            return self._entries.get(key)

    def observe(self, key: str, value: float) -> ChunkImpact:
        """Fold one measured impact (clamped to [0, 1]) into the chunk's running mean; returns the new record."""
        value = min(1.0, max(0.0, value))
        with self._lock:
            known = self._entries.pop(key, None)
            record = ChunkImpact(value, 1) if known is None else known.refined(value)
            self._entries[key] = record
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return record

    def forget(self, key: str) -> None:
        """Drop the chunk's record (its KV is gone)."""
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
