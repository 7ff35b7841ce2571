"""Admission control: a bounded queue per worker; past the bound, reject with a Retry-After estimate."""
from dataclasses import dataclass

from kvplane.checks import check, check_count, check_fraction, check_positive
from scheduler.load import WorkerLoad
from scheduler.service_time import ServiceTimeEstimate


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Queue bound per worker and how retry hints are estimated."""

    max_queued_per_worker: int = 16
    initial_service_time_s: float = 1.0
    service_time_smoothing: float = 0.2
    min_retry_after_s: float = 1.0
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        check_count("max_queued_per_worker", self.max_queued_per_worker, 1)
        check_positive("initial_service_time_s", self.initial_service_time_s)
        check_fraction("service_time_smoothing", self.service_time_smoothing)
        check_positive("min_retry_after_s", self.min_retry_after_s)
        check(
            self.max_retry_after_s >= self.min_retry_after_s,
            "max_retry_after_s",
            f"a number >= min_retry_after_s ({self.min_retry_after_s})",
            self.max_retry_after_s,
        )


@dataclass(frozen=True, slots=True)
class Admitted:
    """The request holds a slot in the worker's queue until `Admission.finish`."""

    worker_id: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """The worker's queue is full; ask the client to come back after `retry_after_s` (HTTP 429)."""

    worker_id: str
    retry_after_s: float


class Admission:
    """Per-worker counters of admitted, unfinished requests; single-threaded, like the async router that owns it."""

    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self._config = config or AdmissionConfig()
        self._queued: dict[str, int] = {}
        self._service: dict[str, ServiceTimeEstimate] = {}

    def reconfigure(self, config: AdmissionConfig) -> None:
        """New bounds and retry hints from the next request on; admitted requests keep their slots."""
        self._config = config

    def try_admit(self, worker_id: str) -> Admitted | Rejected:
        """Take a slot on `worker_id`, or say how long until one is likely free."""
        queued = self._queued.get(worker_id, 0)
        if queued < self._config.max_queued_per_worker:
            self._queued[worker_id] = queued + 1
            return Admitted(worker_id)
        return self._rejected(worker_id)

    def all_full(self, worker_ids: list[str]) -> Rejected | None:
        """The soonest refusal when every one of `worker_ids` is at its bound (None when any has room or none)."""
        if not worker_ids or any(self.num_queued(w) < self._config.max_queued_per_worker for w in worker_ids):
            return None
        return min((self._rejected(w) for w in worker_ids), key=lambda r: r.retry_after_s)

    def finish(self, worker_id: str, service_time_s: float) -> None:
        """Free the slot of a finished (or failed) request and learn from its service time."""
        queued = self._queued.get(worker_id, 0)
        check(queued > 0, "worker_id", "a worker with an admitted request", worker_id)
        self._queued[worker_id] = queued - 1
        self._estimate(worker_id).observe(service_time_s)

    def num_queued(self, worker_id: str) -> int:
        """Admitted, unfinished requests on `worker_id`."""
        return self._queued.get(worker_id, 0)

    def load(self, worker_id: str, num_tokens_in_flight: int) -> WorkerLoad:
        """The router's view of `worker_id`, with the same bound admission enforces."""
        return WorkerLoad(self.num_queued(worker_id), num_tokens_in_flight, self._config.max_queued_per_worker)

    def forget(self, worker_id: str) -> None:
        """Drop a worker that left: its queue died with it."""
        self._queued.pop(worker_id, None)
        self._service.pop(worker_id, None)

    def _rejected(self, worker_id: str) -> Rejected:
        # Draining the whole queue bounds the wait from above; the clamp keeps the hint useful to clients.
        drain_s = self.num_queued(worker_id) * self._estimate(worker_id).seconds
        return Rejected(worker_id, min(max(drain_s, self._config.min_retry_after_s), self._config.max_retry_after_s))

    def _estimate(self, worker_id: str) -> ServiceTimeEstimate:
        if worker_id not in self._service:
            self._service[worker_id] = ServiceTimeEstimate(
                self._config.initial_service_time_s, self._config.service_time_smoothing
            )
        return self._service[worker_id]
