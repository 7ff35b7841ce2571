"""Worker replica autoscaling: a pure policy on queue depth and a TTFT SLO, and its Ray Serve config."""
import math
from dataclasses import asdict, dataclass
from typing import Any

from kvplane.checks import check, check_at_least, check_count, check_non_negative, check_positive


@dataclass(frozen=True, slots=True)
class AutoscalingPolicy:
    """Replica bounds, the two targets (queue per replica, TTFT p95), hysteresis band, step limits and delays."""

    min_replicas: int = 1
    max_replicas: int = 4
    # Admitted, unfinished requests per replica (waiting + running): Ray Serve's "ongoing requests".
    target_queue_per_replica: float = 4.0
    ttft_slo_s: float = 2.0
    # Scale up when either signal exceeds target x upscale_ratio ...
    upscale_ratio: float = 1.0
    # ... and down only when both are under target x downscale_ratio, so one decision does not undo the last.
    downscale_ratio: float = 0.5
    max_step_up: int = 2
    # One at a time down: every replica removed takes its device and RAM caches with it.
    max_step_down: int = 1
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 300.0
    look_back_period_s: float = 30.0
    # How often each replica sends Serve its figures (queue, TTFT p95); shorter than the look-back window.
    metrics_interval_s: float = 10.0

    def __post_init__(self) -> None:
        # At least one replica: scaling to zero would drop every warm cache and reload the model on the next request.
        check_count("min_replicas", self.min_replicas, 1)
        check_count("max_replicas", self.max_replicas, self.min_replicas)
        check_positive("target_queue_per_replica", self.target_queue_per_replica)
        check_positive("ttft_slo_s", self.ttft_slo_s)
        check_at_least("upscale_ratio", self.upscale_ratio, 1.0)
        check(0.0 < self.downscale_ratio < 1.0, "downscale_ratio", "in (0, 1)", self.downscale_ratio)
        check_count("max_step_up", self.max_step_up, 1)
        check_count("max_step_down", self.max_step_down, 1)
        check_non_negative("upscale_delay_s", self.upscale_delay_s)
        check_non_negative("downscale_delay_s", self.downscale_delay_s)
        check_positive("look_back_period_s", self.look_back_period_s)
        check_positive("metrics_interval_s", self.metrics_interval_s)
        # Serve averages over the window: it must hold more than one report.
        window = self.look_back_period_s
        check(
            self.metrics_interval_s < window,
            "metrics_interval_s",
            f"< look_back_period_s ({window})",
            self.metrics_interval_s,
        )

    def clamp(self, num_replicas: int) -> int:
        """`num_replicas` brought within [min_replicas, max_replicas]."""
        return min(max(num_replicas, self.min_replicas), self.max_replicas)


def desired_replicas(
    current_replicas: int, num_queued: int, ttft_p95_s: float | None, policy: AutoscalingPolicy
) -> int:
    """Replicas to run next; `ttft_p95_s` is None when no request finished in the look-back window."""
    check_count("current_replicas", current_replicas, 0)
    check_count("num_queued", num_queued, 0)
    if ttft_p95_s is not None:
        check_non_negative("ttft_p95_s", ttft_p95_s)
    current = policy.clamp(current_replicas)
    # Enough replicas to bring the queue back to target: scaling to it cannot trip the queue rule again.
    needed = math.ceil(num_queued / policy.target_queue_per_replica)
    # Each signal relative to its target; without a TTFT sample a stalled worker still shows in the queue.
    queue_load = num_queued / current / policy.target_queue_per_replica
    ttft_load = 0.0 if ttft_p95_s is None else ttft_p95_s / policy.ttft_slo_s
    pressure = max(queue_load, ttft_load)
    if pressure > policy.upscale_ratio:
        return policy.clamp(min(max(needed, current + 1), current + policy.max_step_up))
    if pressure < policy.downscale_ratio:
        return policy.clamp(max(needed, current - policy.max_step_down))
    return current


# Serve imports the policy by this path (in its controller) and builds it with the policy's fields.
SERVE_POLICY_PATH = "scheduler.serve_policy:ServeAutoscalingPolicy"


def serve_autoscaling_config(policy: AutoscalingPolicy) -> dict[str, Any]:
    """Ray Serve `autoscaling_config` for the worker deployment: bounds and delays, decided by `desired_replicas`."""
    return {
        "min_replicas": policy.min_replicas,
        "initial_replicas": policy.min_replicas,
        "max_replicas": policy.max_replicas,
        "target_ongoing_requests": policy.target_queue_per_replica,
        "upscale_delay_s": policy.upscale_delay_s,
        "downscale_delay_s": policy.downscale_delay_s,
        "look_back_period_s": policy.look_back_period_s,
        "metrics_interval_s": policy.metrics_interval_s,
        "policy": {"policy_function": SERVE_POLICY_PATH, "policy_kwargs": asdict(policy)},
    }
