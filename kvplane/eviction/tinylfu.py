"""W-TinyLFU: frequency-aware admission that keeps a hot set through floods of one-off chunks."""
from kvplane.eviction.segment import Segment
from kvplane.eviction.sketch import FrequencySketch


class TinyLFUPolicy:
    """A small LRU window feeding a segmented-LRU main area (probation + protected)."""

    # A key leaving the window enters main only if its score beats that of every main victim it would
    # displace; score = estimated recent frequency x priority. One-off chunks have frequency ~1, so
    # they die in the window instead of pushing out chunks that are read again and again.

    def __init__(
        self,
        capacity_bytes: int,
        window_fraction: float = 0.01,
        protected_fraction: float = 0.8,
    ) -> None:
        if not (0 <= window_fraction < 1 and 0 < protected_fraction <= 1):
            raise ValueError("window_fraction must be in [0, 1) and protected_fraction in (0, 1]")
        window_bytes = int(capacity_bytes * window_fraction)
        self._main_capacity_bytes = capacity_bytes - window_bytes
        self._window = Segment(window_bytes)
        self._probation = Segment(self._main_capacity_bytes)
        self._protected = Segment(int(self._main_capacity_bytes * protected_fraction))
        self._sketch = FrequencySketch(num_counters=64)
        self._priorities: dict[str, float] = {}

    def admit(self, key: str, nbytes: int, priority: float) -> list[str]:
        """Record a write of `key`; return the keys to evict (`key` itself when it loses admission)."""
        self._priorities[key] = priority
        if self.contains(key):
            # Keys are content hashes: same key, same bytes, so only recency and priority change.
            self.touch(key)
            return []
        self._sketch.add(key)
        self._window.add(key, nbytes)
        # Entry sizes are not known up front, so the sketch grows with the number of resident keys.
        self._sketch.ensure_capacity(len(self._priorities))
        evicted: list[str] = []
        while self._window.overflow_bytes > 0:
            evicted += self._enter_main(*self._window.pop_oldest())
        for gone in evicted:
            self._priorities.pop(gone, None)
        return evicted

    def touch(self, key: str) -> None:
        """Record a read of `key` (hit or miss): counts toward its frequency, refreshes recency."""
        self._sketch.add(key)
        if key in self._probation:
            self._protected.add(key, self._probation.pop(key))
            while self._protected.overflow_bytes > 0:
                self._probation.add(*self._protected.pop_oldest())
        elif key in self._window:
            self._window.refresh(key)
        elif key in self._protected:
            self._protected.refresh(key)

    def remove(self, key: str) -> None:
        """Forget `key`."""
        self._priorities.pop(key, None)
        for segment in (self._window, self._probation, self._protected):
            if key in segment:
                segment.pop(key)

    def contains(self, key: str) -> bool:
        """Whether `key` is resident."""
        return key in self._window or key in self._probation or key in self._protected

    def note_impact(self, key: str, impact: float) -> None:
        """Impact weighs nothing here."""

    def _score(self, key: str) -> float:
        return self._sketch.estimate(key) * self._priorities.get(key, 1.0)

    def _enter_main(self, candidate: str, nbytes: int) -> list[str]:
        need_bytes = self._probation.used_bytes + self._protected.used_bytes + nbytes - self._main_capacity_bytes
        victims: list[tuple[Segment, str]] = []
        for segment in (self._probation, self._protected):
            for key, size in segment.oldest():
                if need_bytes <= 0:
                    break
                victims.append((segment, key))
                need_bytes -= size
        if need_bytes > 0 or any(self._score(key) >= self._score(candidate) for _, key in victims):
            return [candidate]
        for segment, key in victims:
            segment.pop(key)
        self._probation.add(candidate, nbytes)
        return [key for _, key in victims]
