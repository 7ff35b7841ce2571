"""Background writes: tier writes leave the caller's path and can be waited for."""
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

_log = logging.getLogger(__name__)


class WriteBack:
    """A small thread pool whose pending work can be flushed (tasks may submit more tasks)."""

    def __init__(self, num_threads: int, on_error: Callable[[BaseException], None]) -> None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="kvplane-writeback")
        self._pending: set[Future[None]] = set()
        self._lock = threading.Lock()
        self._on_error = on_error

    def submit(self, task: Callable[..., None], *args: object) -> None:
        """Run `task(*args)` in the background."""
        future = self._pool.submit(task, *args)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._finished)

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
            self._pending.discard(future)
        error = future.exception()
        if error is not None:
            _log.warning("kvplane background write failed: %r", error)
            self._on_error(error)
