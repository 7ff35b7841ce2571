"""Least-recently-used eviction: the baseline policy."""
from kvplane.eviction.segment import Segment


class LRUPolicy:
    """Admits everything that fits; evicts the least recently used. Ignores priority."""

    def __init__(self, capacity_bytes: int) -> None:
        self._segment = Segment(capacity_bytes)

    def admit(self, key: str, nbytes: int, priority: float) -> list[str]:
        """Record a write of `key`; return the keys to evict (`key` itself if it can never fit)."""
        if key in self._segment:
            self._segment.refresh(key)
            return []
        if nbytes > self._segment.capacity_bytes:
            return [key]
        self._segment.add(key, nbytes)
        evicted = []
        while self._segment.overflow_bytes > 0:
            evicted.append(self._segment.pop_oldest()[0])
        return evicted

    def touch(self, key: str) -> None:
        """Record a read of `key`."""
        if key in self._segment:
            self._segment.refresh(key)

    def remove(self, key: str) -> None:
        """Forget `key`."""
        if key in self._segment:
            self._segment.pop(key)

    def contains(self, key: str) -> bool:
        """Whether `key` is resident."""
        return key in self._segment

    def note_impact(self, key: str, impact: float) -> None:
        """Impact weighs nothing here."""
