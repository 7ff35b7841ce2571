"""Calls to object storage retried with exponential backoff when the failure may pass (a timeout, a dropped link)."""
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
# Errors that say the object or its content is wrong: another try would fail the same way.
_FINAL = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Up to `attempts` tries, waiting first_delay_s, then twice as long each time."""

    attempts: int = 4
    first_delay_s: float = 0.5

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.first_delay_s < 0:
            raise ValueError(f"first_delay_s must be >= 0, got {self.first_delay_s}")


def is_transient(error: BaseException) -> bool:
    """Whether a storage error may pass on another try: I/O and connection errors, not a missing or denied object."""
    return isinstance(error, (OSError, ConnectionError, TimeoutError)) and not isinstance(error, _FINAL)


def with_backoff(call: Callable[[], T], what: str, backoff: Backoff = Backoff(),
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """`call()`, tried again after a transient error until the tries run out (the last error is raised)."""
    delay_s = backoff.first_delay_s
    for attempt in range(1, backoff.attempts + 1):
        try:
            return call()
        except Exception as error:
            if attempt == backoff.attempts or not is_transient(error):
                raise
            _log.warning("ingest: %s failed (%r); try %d of %d in %.1f s", what, error, attempt + 1,
                         backoff.attempts, delay_s)
            sleep(delay_s)
            delay_s *= 2
    raise AssertionError("unreachable: the last try returns or raises")
