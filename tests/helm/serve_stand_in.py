"""The app as `cluster.app` assembles it (the real ingress), with a model-free stand-in for the worker deployment."""
import time
from typing import Any

from ray import serve
from ray.serve import Application

from cluster.app import assemble
from cluster.config import config_from_dict
from cluster.hot_settings import WORKERS, ttft_window_of
from scheduler.autoscaling import AutoscalingPolicy
from scheduler.serve_policy import TtftWindow


@serve.deployment(name=WORKERS)
class StandInWorker:
    """The worker deployment's Serve surface (options, hot settings, autoscaling hook) without a model."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._ttfts = TtftWindow((config_from_dict(config).autoscaling or AutoscalingPolicy()).look_back_period_s)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self._ttfts = TtftWindow(ttft_window_of(user_config))

    def observe(self, ttft_s: float) -> None:
        """Record a TTFT as if a request had been answered."""
        self._ttfts.add(ttft_s, time.monotonic())

    def record_autoscaling_stats(self) -> dict[str, float]:
        return self._ttfts.autoscaling_stats(time.monotonic())


def build_app(args: dict[str, Any] | None = None) -> Application:
    """`cluster.app.build_app` with the stand-in in place of the worker deployment."""
    return assemble(config_from_dict(args), StandInWorker)
