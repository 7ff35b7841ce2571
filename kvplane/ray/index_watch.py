"""Refills the location index from a store when the index comes back empty after a restart."""
import logging
import threading

import ray
from ray.actor import ActorHandle

from kvplane.ray.index_reporter import IndexReporter
from kvplane.store import TieredStore

WATCH_INTERVAL_S = 5.0
EPOCH_TIMEOUT_S = 5.0

_log = logging.getLogger(__name__)


class IndexWatch:
    """Asks the index for its epoch now and then; a new epoch means it restarted empty, so re-report everything."""

    def __init__(
        self,
        index: ActorHandle,
        store: TieredStore,
        reporter: IndexReporter,
        tiers: frozenset[str] | None = None,
        interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self._index = index
        self._store = store
        self._reporter = reporter
        self._tiers = tiers
        self._interval_s = interval_s
        self._epoch: str | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvplane-index-watch", daemon=True)

    def start(self) -> "IndexWatch":
        """Start watching in the background."""
        self.check()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching."""
        self._stopped.set()

    def check(self) -> int:
        """Re-report this store's placements if the index restarted since the last check; returns how many."""
        try:
            epoch = ray.get(self._index.epoch.remote(), timeout=EPOCH_TIMEOUT_S)
        except Exception:  # the index is restarting or unreachable: the next check sees its new epoch
            return 0
        restarted = self._epoch is not None and epoch != self._epoch
        self._epoch = epoch
        if not restarted:
            return 0
        count = 0
        for tier, key, nbytes in self._store.placements(self._tiers):
            self._reporter(key, tier, nbytes)
            count += 1
        self._reporter.flush()
        _log.warning("kvplane: the location index restarted; re-reported %d placements", count)
        return count

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self.check()
