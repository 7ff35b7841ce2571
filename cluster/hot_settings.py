"""Settings Serve changes on running replicas through `user_config` (reconfigure), never a restart.

The application's args are its code: Ray 2.60 rebuilds the app and restarts every replica when they change
(deploy_utils.get_app_code_version). A deploy config (KubeRay's serveConfigV2) carries these settings as
per-deployment overrides instead, which Ray applies to the replicas it has.
"""
import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from cluster.config import ConfigError, ServeConfig, config_from_dict
from scheduler.admission import AdmissionConfig
from scheduler.autoscaling import AutoscalingPolicy

# The deployments' names (their classes' names in cluster.app): what a deploy config's overrides name.
INGRESS = "Ingress"
WORKERS = "WorkerDeployment"


def ingress_user_config(config: ServeConfig) -> dict[str, Any]:
    """The ingress's hot settings: admission's limits."""
    return {"admission": asdict(config.admission)}


def admission_of(user_config: Mapping[str, Any]) -> AdmissionConfig:
    """Admission's limits from the ingress's `user_config`, checked like the configuration's own section."""
    source = f"{INGRESS} user_config"
    _refuse_unknown(user_config, {"admission"}, source)
    return config_from_dict({"admission": user_config.get("admission", {})}, source).admission


def worker_user_config(config: ServeConfig) -> dict[str, Any]:
    """A worker replica's hot settings: the window of TTFTs it reports to the autoscaling policy."""
    return {"ttft_window_s": (config.autoscaling or AutoscalingPolicy()).look_back_period_s}


def ttft_window_of(user_config: Mapping[str, Any]) -> float:
    """The TTFT window from a worker replica's `user_config`: the policy's look-back period."""
    source = f"{WORKERS} user_config"
    _refuse_unknown(user_config, {"ttft_window_s"}, source)
    window_s = user_config.get("ttft_window_s")
    is_number = isinstance(window_s, (int, float)) and not isinstance(window_s, bool)
    if not (is_number and math.isfinite(window_s) and window_s > 0):
        raise ConfigError([f"ttft_window_s: must be a finite number of seconds > 0, got {window_s!r}"], source)
    return float(window_s)


def _refuse_unknown(user_config: Mapping[str, Any], known: set[str], source: str) -> None:
    if not isinstance(user_config, Mapping):
        raise ConfigError([f"(top level): must be a mapping, got {type(user_config).__name__}"], source)
    unknown = sorted(set(user_config) - known)
    if unknown:
        raise ConfigError([f"{key}: is not a known field" for key in unknown], source)
