"""Admission: a bounded queue per worker; rejections carry a positive Retry-After from queue x service time."""
import pytest

from scheduler.admission import Admission, AdmissionConfig, Admitted, Rejected


def fill(admission: Admission, worker: str, times: int) -> None:
    for _ in range(times):
        assert isinstance(admission.try_admit(worker), Admitted)


def test_admits_up_to_the_bound_then_rejects_with_a_positive_retry_after() -> None:
    admission = Admission(AdmissionConfig(max_queued_per_worker=3))
    fill(admission, "w", 3)
    verdict = admission.try_admit("w")
    assert isinstance(verdict, Rejected) and verdict.worker_id == "w" and verdict.retry_after_s > 0
    assert admission.num_queued("w") == 3


def test_retry_after_is_queue_length_times_recent_service_time() -> None:
    config = AdmissionConfig(max_queued_per_worker=4, initial_service_time_s=1.0, service_time_smoothing=1.0)
    admission = Admission(config)
    fill(admission, "w", 4)
    admission.finish("w", service_time_s=2.5)
    fill(admission, "w", 1)
    verdict = admission.try_admit("w")
    assert isinstance(verdict, Rejected) and verdict.retry_after_s == pytest.approx(4 * 2.5)


@pytest.mark.parametrize(("service_time_s", "expected_s"), [(0.001, 0.5), (100.0, 30.0)])
def test_retry_after_is_clamped(service_time_s: float, expected_s: float) -> None:
    config = AdmissionConfig(
        max_queued_per_worker=2, initial_service_time_s=service_time_s, min_retry_after_s=0.5, max_retry_after_s=30.0
    )
    admission = Admission(config)
    fill(admission, "w", 2)
    assert admission.try_admit("w") == Rejected("w", expected_s)


def test_finishing_frees_a_slot_and_workers_are_independent() -> None:
    admission = Admission(AdmissionConfig(max_queued_per_worker=1))
    fill(admission, "a", 1)
    assert isinstance(admission.try_admit("a"), Rejected)
    fill(admission, "b", 1)
    admission.finish("a", service_time_s=0.1)
    fill(admission, "a", 1)


def test_finish_without_an_admitted_request_is_a_bug() -> None:
    with pytest.raises(ValueError, match="worker_id"):
        Admission().finish("w", service_time_s=0.1)


def test_forgotten_worker_starts_empty() -> None:
    admission = Admission(AdmissionConfig(max_queued_per_worker=1))
    fill(admission, "w", 1)
    admission.forget("w")
    assert admission.num_queued("w") == 0
    fill(admission, "w", 1)


def test_load_view_is_full_exactly_when_admission_rejects() -> None:
    admission = Admission(AdmissionConfig(max_queued_per_worker=2))
    fill(admission, "w", 1)
    assert not admission.load("w", num_tokens_in_flight=10).is_full
    fill(admission, "w", 1)
    load = admission.load("w", num_tokens_in_flight=10)
    assert load.is_full and load.num_tokens_in_flight == 10
    assert isinstance(admission.try_admit("w"), Rejected)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_queued_per_worker": 0}, "max_queued_per_worker"),
        ({"initial_service_time_s": 0.0}, "initial_service_time_s"),
        ({"service_time_smoothing": 0.0}, "service_time_smoothing"),
        ({"min_retry_after_s": 0.0}, "min_retry_after_s"),
        ({"min_retry_after_s": 5.0, "max_retry_after_s": 1.0}, "max_retry_after_s"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        AdmissionConfig(**kwargs)


def test_all_full_refuses_only_when_every_worker_is_at_its_bound():
    admission = Admission(AdmissionConfig(max_queued_per_worker=1, initial_service_time_s=3.0))
    assert admission.all_full([]) is None
    admission.try_admit("a")
    assert admission.all_full(["a", "b"]) is None
    admission.try_admit("b")
    verdict = admission.all_full(["a", "b"])
    assert verdict is not None and verdict.retry_after_s == 3.0
