"""What a worker is busy with, as the router sees it."""
from dataclasses import dataclass

from kvplane.checks import check_count


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """Requests admitted and not finished, prompt and decode tokens in flight, and the queue bound."""

    num_queued: int
    num_tokens_in_flight: int
    queue_capacity: int

    def __post_init__(self) -> None:
        check_count("num_queued", self.num_queued, 0)
        check_count("num_tokens_in_flight", self.num_tokens_in_flight, 0)
        check_count("queue_capacity", self.queue_capacity, 1)

    @property
    def is_full(self) -> bool:
        """No room left in the worker's bounded queue."""
        return self.num_queued >= self.queue_capacity
