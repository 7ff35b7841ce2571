"""The policy drives real Ray Serve: the replicas' TTFT p95 and the queue scale a deployment up, then back down."""
import asyncio
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from ray.serve.config import AutoscalingConfig

from scheduler.autoscaling import AutoscalingPolicy, serve_autoscaling_config
from scheduler.serve_policy import TTFT_P95_METRIC, ServeAutoscalingPolicy, TtftWindow
from tests.local_ray import free_port, local_serve

# Fast enough to watch in a test: Serve's own control loop runs every 0.1 s.
POLICY = AutoscalingPolicy(
    min_replicas=1, max_replicas=2, target_queue_per_replica=2.0, ttft_slo_s=1.0,
    upscale_delay_s=0.0, downscale_delay_s=1.0, look_back_period_s=1.0, metrics_interval_s=0.2,
)
SCALE_TIMEOUT_S = 30.0


def test_ttft_window_reports_the_nearest_rank_p95_of_its_window():
    window = TtftWindow(window_s=100.0)
    assert window.autoscaling_stats(now_s=0.0) == {}
    for i in range(1, 21):
        window.add(float(i), now_s=float(i))
    assert window.p95_s(now_s=20.0) == 19.0  # ceil(0.95 * 20) = 19th of 20
    assert window.autoscaling_stats(now_s=115.0) == {TTFT_P95_METRIC: 20.0}  # only 15..20 remain
    assert window.p95_s(now_s=121.0) is None


def test_ttft_window_keeps_only_the_newest_samples():
    window = TtftWindow(window_s=100.0, max_samples=3)
    for ttft_s in (9.0, 9.0, 1.0, 1.0, 1.0):
        window.add(ttft_s, now_s=0.0)
    assert window.p95_s(now_s=0.0) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"window_s": 0.0}, "window_s"), ({"window_s": 1.0, "max_samples": 0}, "max_samples")]
)
def test_bad_window_names_the_field(kwargs: dict, field: str):
    with pytest.raises(ValueError, match=field):
        TtftWindow(**kwargs)


def _context(current: int, total_requests: float, ttfts: dict[str, float]) -> SimpleNamespace:
    """What Serve hands a policy, reduced to the fields the policy reads."""
    return SimpleNamespace(
        current_num_replicas=current,
        total_num_requests=total_requests,
        running_replicas=list(ttfts),
        aggregated_metrics={TTFT_P95_METRIC: ttfts} if ttfts else {},
        config=None,
    )


def test_policy_reads_the_queue_and_the_worst_replica_ttft():
    policy = ServeAutoscalingPolicy(**serve_autoscaling_config(POLICY)["policy"]["policy_kwargs"])
    assert policy.policy == POLICY
    assert policy(_context(1, 0.0, {}))[0] == 1
    assert policy(_context(1, 2.5, {}))[0] == 2  # 3 queued (a fraction still holds a slot) over a target of 2
    assert policy(_context(1, 0.0, {"a": 0.2, "b": 1.5}))[0] == 2  # one replica over the SLO is enough
    assert policy(_context(2, 0.0, {"a": 0.2, "b": 0.3}))[0] == 1


def test_stopped_replicas_do_not_count():
    policy = ServeAutoscalingPolicy(**serve_autoscaling_config(POLICY)["policy"]["policy_kwargs"])
    context = _context(2, 0.0, {"a": 0.2})
    context.aggregated_metrics[TTFT_P95_METRIC]["gone"] = 9.0
    assert policy(context)[0] == 1


def test_serve_builds_the_policy_from_the_config():
    config = AutoscalingConfig(**serve_autoscaling_config(POLICY))
    built = config.policy.get_policy()(**config.policy.policy_kwargs)
    assert isinstance(built, ServeAutoscalingPolicy) and built.policy == POLICY


@pytest.fixture(scope="module")
def serve_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Ray and Serve on loopback, with handles pushing their queue as often as the replicas push theirs."""
    # The queue Serve counts at the caller's handle is pushed on its own clock (Ray's setting; 10 s by default).
    push = {"RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": str(POLICY.metrics_interval_s)}
    with local_serve(tmp_path_factory.mktemp("autoscale"), num_cpus=2, object_store_bytes=100 << 20,
                     http_port=free_port(), env=push):
        yield


def _running_replicas(app: str, deployment: str) -> int:
    from ray import serve

    status = serve.status().applications[app].deployments[deployment]
    return status.replica_states.get("RUNNING", 0)


def _wait_for(condition: Callable[[], bool], what: str) -> float:
    """Seconds until `condition` held; fails after SCALE_TIMEOUT_S."""
    start_s = time.monotonic()
    while not condition():
        if time.monotonic() - start_s > SCALE_TIMEOUT_S:
            raise AssertionError(f"not within {SCALE_TIMEOUT_S} s: {what}")
        time.sleep(0.1)
    return time.monotonic() - start_s


# make test's budget: Serve adding a worker replica on a TTFT over the SLO runs by default in
# tests/helm/test_upgrades.py (the chart's app, then a hot upgrade); the policy's own logic above.
@pytest.mark.slow
def test_serve_scales_on_the_replicas_ttft_then_back_down(serve_instance: None):
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0}, autoscaling_config=serve_autoscaling_config(POLICY))
    class SlowFirstToken:
        """Reports TTFTs it is told to, through the same window and hook as the worker deployment."""

        def __init__(self) -> None:
            self.ttfts = TtftWindow(POLICY.look_back_period_s)

        def observe(self, ttft_s: float) -> None:
            self.ttfts.add(ttft_s, time.monotonic())

        def record_autoscaling_stats(self) -> dict[str, float]:
            return self.ttfts.autoscaling_stats(time.monotonic())

    handle = serve.run(SlowFirstToken.bind(), name="ttft", route_prefix=None)
    assert _running_replicas("ttft", "SlowFirstToken") == 1

    def slow_and_scaled() -> bool:
        # Requests far over the 1 s SLO, no queue at all, until a second replica runs. One request would leave the
        # 1 s window before a busy machine's controller reads it (the test failed so on a loaded 2-core machine).
        handle.observe.remote(5.0).result()
        return _running_replicas("ttft", "SlowFirstToken") == 2

    _wait_for(slow_and_scaled, "TTFT over the SLO adds a replica")
    # The slow TTFT leaves the 1 s window; with no queue either, the policy steps down after the 1 s delay.
    _wait_for(lambda: _running_replicas("ttft", "SlowFirstToken") == 1, "a quiet deployment drops back to one")
    serve.delete("ttft")


@pytest.mark.slow  # make test's budget: Serve autoscaling on the policy runs by default in tests/helm/test_upgrades.py
def test_serve_scales_on_the_queue_then_back_down(serve_instance: None):
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0}, autoscaling_config=serve_autoscaling_config(POLICY))
    class Busy:
        async def work(self, seconds: float) -> None:
            await asyncio.sleep(seconds)

    handle = serve.run(Busy.bind(), name="queue", route_prefix=None)
    assert _running_replicas("queue", "Busy") == 1
    pending = [handle.work.remote(4.0) for _ in range(6)]  # 6 ongoing over a target of 2 per replica
    _wait_for(lambda: _running_replicas("queue", "Busy") == 2, "a long queue adds a replica")
    for response in pending:
        response.result()
    _wait_for(lambda: _running_replicas("queue", "Busy") == 1, "an empty queue drops back to one")
    serve.delete("queue")
