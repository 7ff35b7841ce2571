"""A circuit breaker for one kind of call to a tier: after a failure, skip calls for a growing backoff."""
import threading
import time
from collections.abc import Callable


class Breaker:
    """Closed until a call fails; then open for a backoff that doubles while failures go on; a success closes it."""

    # A tier that hangs or refuses (an S3 endpoint gone, a full disk) costs one timeout per backoff period
    # instead of one per request; the first call after the backoff probes whether it is back.

    def __init__(
        self, min_backoff_s: float = 1.0, max_backoff_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not 0 < min_backoff_s <= max_backoff_s:
            raise ValueError("backoffs must satisfy 0 < min_backoff_s <= max_backoff_s")
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self._backoff_s = 0.0
        self._open_until_s = 0.0
        self._lock = threading.Lock()

    @property
    def tripped(self) -> bool:
        """Whether the last call failed (the tier is down as far as anyone knows, skipped or being probed)."""
        with self._lock:
            return self._backoff_s > 0

    def allows(self) -> bool:
        """Whether a call may go ahead now."""
        with self._lock:
            return self._clock() >= self._open_until_s

    def failed(self) -> float:
        """Record a failure; returns the backoff now in force."""
        with self._lock:
            self._backoff_s = min(max(2 * self._backoff_s, self._min_backoff_s), self._max_backoff_s)
            self._open_until_s = self._clock() + self._backoff_s
            return self._backoff_s

    def succeeded(self) -> bool:
        """Record a success; returns whether the breaker had tripped before (the tier is back)."""
        with self._lock:
            tripped = self._backoff_s > 0
            self._backoff_s = 0.0
            self._open_until_s = 0.0
            return tripped
