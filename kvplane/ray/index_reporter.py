"""Ships a store's placement events to the location index in batches."""
import threading
import time

from ray.actor import ActorHandle

from kvplane.ray.location_index import PlacementEvent


class IndexReporter:
    """A store listener batching one holder's events; a batch goes when full or `interval_s` old."""

    def __init__(
        self,
        index: ActorHandle,
        holder: str,
        tiers: frozenset[str] | None = None,
        batch_size: int = 64,
        interval_s: float = 1.0,
    ) -> None:
        if batch_size < 1 or interval_s < 0:
            raise ValueError("batch_size must be >= 1 and interval_s >= 0")
        self._index = index
        self._holder = holder
        self._tiers = tiers
        self._batch_size = batch_size
        self._interval_s = interval_s
        self._events: list[PlacementEvent] = []
        self._last_sent_s = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, key: str, tier: str, nbytes: int) -> None:
        """Queue one event (events of tiers outside `tiers` are not this holder's to report)."""
        if self._tiers is not None and tier not in self._tiers:
            return
        with self._lock:
            self._events.append((key, tier, nbytes))
            due = len(self._events) >= self._batch_size or time.monotonic() - self._last_sent_s >= self._interval_s
        if due:
            self.flush()

    def flush(self) -> None:
        """Send what is queued."""
        # Sent under the lock so batches reach the index in the order their events happened.
        with self._lock:
            events, self._events = self._events, []
            self._last_sent_s = time.monotonic()
            if events:
                self._index.apply.remote(self._holder, events)
