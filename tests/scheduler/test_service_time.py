"""Recent service time: a prior until samples arrive, then an exponentially weighted average."""
import pytest

from scheduler.service_time import ServiceTimeEstimate


def test_starts_at_the_prior_and_moves_toward_samples() -> None:
    estimate = ServiceTimeEstimate(initial_s=1.0, smoothing=0.5)
    assert estimate.seconds == 1.0
    estimate.observe(3.0)
    assert estimate.seconds == 2.0
    for _ in range(30):
        estimate.observe(3.0)
    assert estimate.seconds == pytest.approx(3.0)


def test_full_smoothing_keeps_only_the_last_sample() -> None:
    estimate = ServiceTimeEstimate(initial_s=1.0, smoothing=1.0)
    estimate.observe(0.25)
    assert estimate.seconds == 0.25


@pytest.mark.parametrize(
    ("initial_s", "smoothing", "field"), [(0.0, 0.5, "initial_s"), (1.0, 0.0, "smoothing"), (1.0, 1.5, "smoothing")]
)
def test_bad_knobs_name_the_field(initial_s: float, smoothing: float, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ServiceTimeEstimate(initial_s, smoothing)


def test_negative_sample_is_refused() -> None:
    with pytest.raises(ValueError, match="service_time_s"):
        ServiceTimeEstimate(1.0, 0.5).observe(-1.0)
