"""`desired_replicas` as Ray Serve's custom autoscaling policy, and the TTFT window worker replicas report to it."""
import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kvplane.checks import check_count, check_non_negative, check_positive
from scheduler.autoscaling import AutoscalingPolicy, desired_replicas

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingConfig, AutoscalingContext

# The custom metric each worker replica reports through Serve's `record_autoscaling_stats` hook.
TTFT_P95_METRIC = "ttft_p95_s"
TTFT_QUANTILE = 0.95
# Most TTFTs a replica keeps: bounds memory and the sort at each report under heavy traffic.
MAX_TTFT_SAMPLES = 4096


@dataclass(slots=True)
class TtftWindow:
    """The TTFTs a replica observed in the last `window_s` seconds, and their p95."""

    window_s: float
    max_samples: int = MAX_TTFT_SAMPLES
    _samples: deque[tuple[float, float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_positive("window_s", self.window_s)
        check_count("max_samples", self.max_samples, 1)
        self._samples = deque(maxlen=self.max_samples)

    def add(self, ttft_s: float, now_s: float) -> None:
        """Record one request's time to first token, observed at `now_s`."""
        check_non_negative("ttft_s", ttft_s)
        self._samples.append((now_s, ttft_s))

    def p95_s(self, now_s: float) -> float | None:
        """The nearest-rank p95 of the TTFTs inside the window; None when there are none."""
        while self._samples and self._samples[0][0] < now_s - self.window_s:
            self._samples.popleft()
        if not self._samples:
            return None
        ordered = sorted(ttft_s for _, ttft_s in self._samples)
        return ordered[math.ceil(TTFT_QUANTILE * len(ordered)) - 1]

    def autoscaling_stats(self, now_s: float) -> dict[str, float]:
        """What `record_autoscaling_stats` returns: the p95, or nothing while no request finished in the window."""
        p95_s = self.p95_s(now_s)
        return {} if p95_s is None else {TTFT_P95_METRIC: p95_s}


class ServeAutoscalingPolicy:
    """Ray Serve calls this each control-loop tick; Serve applies the bounds and the up/down delays after it."""

    def __init__(self, **policy: Any) -> None:
        self.policy = AutoscalingPolicy(**policy)
        self._serve_config: Any = None
        self._effective = self.policy

    def __call__(self, ctx: "AutoscalingContext") -> tuple[int, dict[str, Any]]:
        """Replicas wanted now, from Serve's ongoing requests (the admitted queue) and the replicas' TTFT p95."""
        policy = self._under(ctx.config)
        reported = (ctx.aggregated_metrics or {}).get(TTFT_P95_METRIC, {})
        running = set(ctx.running_replicas)
        p95s = [value for replica, value in reported.items() if replica in running]
        # The pooled p95 never exceeds the worst replica's: scaling on the maximum keeps the SLO for every request.
        ttft_p95_s = max(p95s) if p95s else None
        # Serve averages the queue over the look-back window; a fraction of a request still occupies a slot.
        num_queued = math.ceil(max(0.0, ctx.total_num_requests))
        return desired_replicas(ctx.current_num_replicas, num_queued, ttft_p95_s, policy), {}

    def _under(self, config: "AutoscalingConfig | None") -> AutoscalingPolicy:
        """The policy with the bounds, target, delays and window Serve's `autoscaling_config` carries taken from it."""
        # Serve applies those itself, and a deploy config changes them without a restart (a lightweight update);
        # the kwargs are part of the app's code version in Ray 2.60 (deploy_utils.get_app_code_version).
        if config is None:
            return self.policy
        if config is not self._serve_config:
            self._serve_config = config
            self._effective = replace(
                self.policy,
                min_replicas=config.min_replicas,
                max_replicas=config.max_replicas,
                target_queue_per_replica=config.target_ongoing_requests,
                upscale_delay_s=config.upscale_delay_s,
                downscale_delay_s=config.downscale_delay_s,
                look_back_period_s=config.look_back_period_s,
                metrics_interval_s=config.metrics_interval_s,
            )
        return self._effective
