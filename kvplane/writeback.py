"""Background writes: tier writes leave the caller's path, can be waited for, and are bounded."""
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

_log = logging.getLogger(__name__)

MAX_PENDING_TASKS = 1024
MAX_PENDING_BYTES = 256 << 20


class WriteBack:
    """A small thread pool whose pending work can be flushed (tasks may submit more tasks) and is bounded."""

    # Write-backs hold the blob they copy. When the tiers below cannot keep up, a bound on what waits
    # (tasks and the bytes they hold) keeps memory flat: past it a task is refused and its caller decides.

    def __init__(
        self,
        num_threads: int,
        on_error: Callable[[BaseException], None],
        max_pending_tasks: int = MAX_PENDING_TASKS,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ) -> None:
        if num_threads < 1 or max_pending_tasks < 1 or max_pending_bytes < 0:
            raise ValueError("need num_threads >= 1, max_pending_tasks >= 1 and max_pending_bytes >= 0")
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="kvplane-writeback")
        self._pending: dict[Future[None], int] = {}
        self._pending_bytes = 0
        self._max_pending_tasks = max_pending_tasks
        self._max_pending_bytes = max_pending_bytes
        self._lock = threading.Lock()
        self._on_error = on_error
        self.dropped = 0

    def submit(self, task: Callable[..., None], *args: object, nbytes: int = 0) -> bool:
        """Run `task(*args)` in the background, or refuse (False) when the queue is at its bound."""
        with self._lock:
            full = len(self._pending) >= self._max_pending_tasks
            if full or (nbytes > 0 and self._pending_bytes + nbytes > self._max_pending_bytes):
                self.dropped += 1
                return False
            self._pending_bytes += nbytes
            future = self._pool.submit(task, *args)
            self._pending[future] = nbytes
        future.add_done_callback(self._finished)
        return True

    def flush(self) -> None:
        """Wait until nothing is pending, including work submitted by running tasks."""
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return
            wait(pending)

    def close(self) -> None:
        """Finish pending work and stop the threads."""
        self.flush()
        self._pool.shutdown(wait=True)

    def _finished(self, future: Future[None]) -> None:
        with self._lock:
            self._pending_bytes -= self._pending.pop(future, 0)
        error = future.exception()
        if error is not None:
            _log.warning("kvplane background write failed: %r", error)
            self._on_error(error)
