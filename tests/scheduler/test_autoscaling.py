"""Autoscaling: up on queue or TTFT, down only when both are comfortable, bounded, step-limited; Serve config valid."""
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ray.serve.config import AutoscalingConfig

from scheduler.autoscaling import AutoscalingPolicy, desired_replicas, serve_autoscaling_config

POLICY = AutoscalingPolicy(
    min_replicas=1, max_replicas=8, target_queue_per_replica=4.0, ttft_slo_s=2.0, max_step_up=2, max_step_down=1
)


def test_scales_up_when_the_queue_per_replica_is_over_target() -> None:
    assert desired_replicas(2, num_queued=10, ttft_p95_s=0.5, policy=POLICY) == 3


def test_scale_up_follows_the_queue_but_within_the_step_limit() -> None:
    assert desired_replicas(2, num_queued=40, ttft_p95_s=0.5, policy=POLICY) == 4


def test_scales_up_when_ttft_breaks_the_slo_even_with_a_short_queue() -> None:
    assert desired_replicas(2, num_queued=2, ttft_p95_s=2.5, policy=POLICY) == 3


def test_holds_inside_the_hysteresis_band() -> None:
    assert desired_replicas(3, num_queued=9, ttft_p95_s=0.5, policy=POLICY) == 3  # queue 3/replica: not < 2
    assert desired_replicas(3, num_queued=3, ttft_p95_s=1.5, policy=POLICY) == 3  # TTFT not < 1 s


def test_scales_down_one_step_when_both_signals_are_comfortable() -> None:
    assert desired_replicas(4, num_queued=0, ttft_p95_s=0.2, policy=POLICY) == 3
    assert desired_replicas(4, num_queued=0, ttft_p95_s=None, policy=POLICY) == 3


def test_never_past_the_bounds() -> None:
    assert desired_replicas(8, num_queued=1000, ttft_p95_s=10.0, policy=POLICY) == 8
    assert desired_replicas(1, num_queued=0, ttft_p95_s=None, policy=POLICY) == 1
    assert desired_replicas(20, num_queued=0, ttft_p95_s=None, policy=POLICY) == 7  # clamped to 8, then one step down
    assert desired_replicas(0, num_queued=0, ttft_p95_s=None, policy=POLICY) == 1


policies = st.builds(
    lambda low, span, target, slo, up, down, step_up, step_down: AutoscalingPolicy(
        min_replicas=low,
        max_replicas=low + span,
        target_queue_per_replica=target,
        ttft_slo_s=slo,
        upscale_ratio=up,
        downscale_ratio=down,
        max_step_up=step_up,
        max_step_down=step_down,
    ),
    st.integers(1, 5),
    st.integers(0, 20),
    st.floats(0.5, 32.0),
    st.floats(0.1, 10.0),
    st.floats(1.0, 3.0),
    st.floats(0.05, 0.95),
    st.integers(1, 4),
    st.integers(1, 4),
)
replicas = st.integers(0, 30)
queues = st.integers(0, 2000)
ttfts = st.none() | st.floats(0.0, 60.0)


@given(policies, replicas, queues, ttfts)
def test_result_is_within_bounds_and_step_limits(
    policy: AutoscalingPolicy, current: int, queued: int, ttft: float | None
) -> None:
    result = desired_replicas(current, queued, ttft, policy)
    assert policy.min_replicas <= result <= policy.max_replicas
    start = policy.clamp(current)
    assert start - policy.max_step_down <= result <= start + policy.max_step_up


@given(policies, replicas, queues, queues, ttfts)
def test_a_longer_queue_never_asks_for_fewer_replicas(
    policy: AutoscalingPolicy, current: int, queued_a: int, queued_b: int, ttft: float | None
) -> None:
    low, high = sorted((queued_a, queued_b))
    assert desired_replicas(current, low, ttft, policy) <= desired_replicas(current, high, ttft, policy)


@given(policies, replicas, queues, st.floats(0.0, 60.0), st.floats(0.0, 60.0))
def test_a_slower_ttft_never_asks_for_fewer_replicas(
    policy: AutoscalingPolicy, current: int, queued: int, ttft_a: float, ttft_b: float
) -> None:
    low, high = sorted((ttft_a, ttft_b))
    assert desired_replicas(current, queued, low, policy) <= desired_replicas(current, queued, high, policy)


@given(policies, replicas, queues, ttfts)
def test_a_scale_down_is_not_undone_by_the_same_load(
    policy: AutoscalingPolicy, current: int, queued: int, ttft: float | None
) -> None:
    result = desired_replicas(current, queued, ttft, policy)
    if result < policy.clamp(current):
        assert desired_replicas(result, queued, ttft, policy) <= result


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_replicas": 0}, "min_replicas"),
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
        ({"target_queue_per_replica": 0.0}, "target_queue_per_replica"),
        ({"ttft_slo_s": -1.0}, "ttft_slo_s"),
        ({"upscale_ratio": 0.9}, "upscale_ratio"),
        ({"downscale_ratio": 1.0}, "downscale_ratio"),
        ({"max_step_up": 0}, "max_step_up"),
        ({"max_step_down": 0}, "max_step_down"),
        ({"upscale_delay_s": -1.0}, "upscale_delay_s"),
        ({"look_back_period_s": 0.0}, "look_back_period_s"),
        ({"metrics_interval_s": 0.0}, "metrics_interval_s"),
        ({"metrics_interval_s": 30.0}, "metrics_interval_s"),  # not shorter than the 30 s look-back window
    ],
)
def test_bad_policy_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        AutoscalingPolicy(**kwargs)


@pytest.mark.parametrize(("current", "queued", "field"), [(-1, 0, "current_replicas"), (1, -1, "num_queued")])
def test_bad_inputs_name_the_field(current: int, queued: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        desired_replicas(current, queued, None, POLICY)


@given(policies)
def test_serve_autoscaling_config_validates_in_ray_serve(policy: AutoscalingPolicy) -> None:
    config = serve_autoscaling_config(policy)
    # Pydantic ignores unknown keys here, so a misspelt knob would pass silently: check the names too.
    assert set(config) <= set(AutoscalingConfig.model_fields)
    validated = AutoscalingConfig(**config)
    assert validated.min_replicas == policy.min_replicas
    assert validated.max_replicas == policy.max_replicas
    assert validated.target_ongoing_requests == policy.target_queue_per_replica
    assert validated.upscale_delay_s == policy.upscale_delay_s
    assert validated.downscale_delay_s == policy.downscale_delay_s
    assert validated.metrics_interval_s == policy.metrics_interval_s
    assert validated.policy.policy_function == "scheduler.serve_policy:ServeAutoscalingPolicy"
    assert AutoscalingPolicy(**validated.policy.policy_kwargs) == policy
