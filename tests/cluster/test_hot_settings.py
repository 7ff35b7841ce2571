"""The settings a running replica takes through Serve's reconfigure: admission at the ingress, the TTFT window at
the workers, bounds and targets in the autoscaling policy. tests/helm/test_upgrades.py runs them on Ray Serve."""
from types import SimpleNamespace

import pytest
from ray.serve.config import AutoscalingConfig

from cluster.app import Ingress, WorkerDeployment, build_app, ingress_options, worker_options
from cluster.config import ConfigError, ServeConfig, config_from_dict
from cluster.gateway import Gateway
from cluster.hot_settings import (
    INGRESS,
    WORKERS,
    admission_of,
    ingress_user_config,
    ttft_window_of,
    worker_user_config,
)
from scheduler.admission import Admission, AdmissionConfig, Admitted, Rejected
from scheduler.serve_policy import ServeAutoscalingPolicy
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model


def test_the_overrides_name_the_apps_deployments():
    assert (Ingress.name, WorkerDeployment.name) == (INGRESS, WORKERS)


def test_the_code_carries_the_same_hot_settings_a_deploy_config_overrides():
    """`blendserve serve` sets in code what the chart's serveConfigV2 overrides: one reconfigure path for both."""
    config = config_from_dict({"admission": {"max_queued_per_worker": 4},
                               "autoscaling": {"min_replicas": 1, "max_replicas": 3, "look_back_period_s": 20.0}})
    assert ingress_options(config)["user_config"] == ingress_user_config(config)
    assert admission_of(ingress_options(config)["user_config"]) == config.admission
    assert ingress_options(config)["num_replicas"] == 1
    assert ttft_window_of(worker_options(config)["user_config"]) == 20.0
    assert worker_user_config(ServeConfig()) == {"ttft_window_s": 30.0}  # the default policy's look-back
    build_app({"admission": {"max_queued_per_worker": 4}})  # the local path still builds


def test_admission_from_the_user_config_is_checked_like_the_config():
    assert admission_of({}) == AdmissionConfig()
    assert admission_of({"admission": {"max_queued_per_worker": 3}}).max_queued_per_worker == 3
    with pytest.raises(ConfigError, match=r"admission\.max_queued_per_worker"):
        admission_of({"admission": {"max_queued_per_worker": 0}})
    with pytest.raises(ConfigError, match="Ingress user_config:\n  limits: is not a known field"):
        admission_of({"admission": {}, "limits": {}})


@pytest.mark.parametrize("user_config", [{}, {"ttft_window_s": 0}, {"ttft_window_s": "30"},
                                         {"ttft_window_s": True}, {"ttft_window_s": 30.0, "slo": 1.0}])
def test_a_bad_worker_user_config_names_the_field(user_config: dict):
    with pytest.raises(ConfigError, match="WorkerDeployment user_config:\n  (ttft_window_s|slo):"):
        ttft_window_of(user_config)


def test_a_lower_admission_bound_stops_new_requests_and_keeps_admitted_ones():
    admission = Admission(AdmissionConfig(max_queued_per_worker=3))
    assert [admission.try_admit("w") for _ in range(2)] == [Admitted("w")] * 2
    admission.reconfigure(AdmissionConfig(max_queued_per_worker=1))
    assert isinstance(admission.try_admit("w"), Rejected)
    admission.finish("w", 0.5)  # a request admitted under the old bound still frees its slot
    admission.finish("w", 0.5)
    assert admission.try_admit("w") == Admitted("w")


def test_the_gateway_refuses_at_its_new_bound():
    model, tokenizer = load_model_card(prepare_default_model())
    gateway = Gateway(ServeConfig(), model, tokenizer, SimpleNamespace(), SimpleNamespace())
    gateway.set_admission(AdmissionConfig(max_queued_per_worker=1))
    assert gateway.admission.try_admit("w") == Admitted("w")
    verdict = gateway.admission.try_admit("w")
    assert isinstance(verdict, Rejected)
    assert "queue bound of 1" in str(gateway._too_many(verdict))


def _context(config: AutoscalingConfig | None, current: int, total_requests: float) -> SimpleNamespace:
    """What Serve hands the policy, reduced to the fields it reads."""
    return SimpleNamespace(current_num_replicas=current, total_num_requests=total_requests, running_replicas=[],
                           aggregated_metrics={}, config=config)


def test_the_policy_takes_bounds_and_target_from_serves_config():
    """Serve's autoscaling_config changes without re-versioning the app; the kwargs only carry the policy's shape."""
    policy = ServeAutoscalingPolicy(ttft_slo_s=1.0)  # the kwargs the chart gives: max_replicas 4, target 4 by default
    tighter = AutoscalingConfig(min_replicas=1, max_replicas=2, target_ongoing_requests=4.0)
    assert policy(_context(tighter, 2, 20.0))[0] == 2  # the kwargs' default bound of 4 would allow 4
    patient = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=10.0)
    assert policy(_context(patient, 1, 8.0))[0] == 1  # 8 queued is under a target of 10; over the default 4
    assert policy(_context(None, 1, 8.0))[0] == 2  # outside Serve: the kwargs alone
