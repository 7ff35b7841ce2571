"""A recent service time per worker: exponentially weighted, so it follows load changes."""
from kvplane.checks import check_fraction, check_non_negative, check_positive


class ServiceTimeEstimate:
    """EWMA of request service times; starts from a prior until samples arrive."""

    def __init__(self, initial_s: float, smoothing: float) -> None:
        check_positive("initial_s", initial_s)
        check_fraction("smoothing", smoothing)
        self._estimate_s = initial_s
        self._smoothing = smoothing

    def observe(self, service_time_s: float) -> None:
        """Fold in one finished request's service time."""
        check_non_negative("service_time_s", service_time_s)
        self._estimate_s += self._smoothing * (service_time_s - self._estimate_s)

    @property
    def seconds(self) -> float:
        """The current estimate."""
        return self._estimate_s
