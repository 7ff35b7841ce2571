"""A `helm upgrade` that changes a hot value is a lightweight Serve update; the HTTP endpoint stays put.

KubeRay v1.7.0 PUTs serveConfigV2 to the dashboard whenever its text changes (rayservice_controller.go
checkIfNeedSubmitServeApplications, updateServeDeployment). Ray 2.60 rebuilds the application, and restarts every
replica, when the application's code version changes (application_state.py ApplicationState.apply_app_config,
deploy_utils.py get_app_code_version: import path, runtime env, args, autoscaling policies); otherwise it applies
the per-deployment overrides to the running replicas.
"""
import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
from ray.serve._private.deploy_utils import get_app_code_version
from ray.serve.config import AutoscalingConfig
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

from cluster.hot_settings import INGRESS, WORKERS
from scheduler.autoscaling import SERVE_POLICY_PATH, AutoscalingPolicy, serve_autoscaling_config
from tests.helm.kuberay_services import container_port, pods, serve_service
from tests.helm.rendering import manifests, of_kind, one, render, serve_config
from tests.local_ray import free_port, local_serve

GATEWAY = {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
    "gatewayClassName": "istio", "stepSizePercent": 25, "intervalSeconds": 60}}
# The chart's helm test needs the Gateway's address under this strategy: it is not what these tests are about.
INCREMENTAL = {"upgradeStrategy": GATEWAY, "helmTest": {"enabled": False}}
FIXED = {"autoscaling": {"enabled": False}, "replica": {"numCpus": 1, "numGpus": 1, "count": 2}}
HOT_CHANGES = {
    "max_replicas": (None, {"autoscaling": {"policy": {"max_replicas": 3}}}),
    "min_replicas": (None, {"autoscaling": {"policy": {"min_replicas": 2}}, "replica": {"count": 2}}),
    "target_queue": (None, {"autoscaling": {"policy": {"target_queue_per_replica": 6.0}}}),
    "delays": (None, {"autoscaling": {"policy": {"upscale_delay_s": 10.0, "downscale_delay_s": 900.0}}}),
    "look_back": (None, {"autoscaling": {"policy": {"look_back_period_s": 60.0}}}),
    "admission": (None, {"config": {"admission": {"max_queued_per_worker": 8, "max_retry_after_s": 30.0}}}),
    "fixed_count": (FIXED, {"replica": {"count": 3}}),
}


def _merged(base: dict[str, Any] | None, change: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base or {})
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _application(values: dict[str, Any] | None) -> dict[str, Any]:
    (application,) = serve_config(manifests(values))["applications"]
    return application


def _overrides(application: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in application.get("deployments", [])}


@pytest.mark.parametrize("name", list(HOT_CHANGES))
def test_a_hot_value_keeps_the_apps_code_version(name: str):
    base, change = HOT_CHANGES[name]
    before, after = _application(base), _application(_merged(base, change))
    assert before != after  # KubeRay submits the new text ...
    # ... and Ray's own change detection sees the same code: no rebuild, no replica restarted.
    assert get_app_code_version(ServeApplicationSchema(**before)) == get_app_code_version(
        ServeApplicationSchema(**after))


def test_the_policy_shape_is_code():
    """Knobs only blendserve's policy reads (SLO, ratios, steps) are its constructor's kwargs: a new version."""
    before = _application(None)
    after = _application({"autoscaling": {"policy": {"ttft_slo_s": 1.0}}})
    assert get_app_code_version(ServeApplicationSchema(**before)) != get_app_code_version(
        ServeApplicationSchema(**after))


@pytest.mark.parametrize("values", [None, FIXED], ids=["autoscaling", "fixed"])
def test_serve_config_is_a_deploy_config_whose_args_hold_no_hot_value(values):
    deploy = ServeDeploySchema(**serve_config(manifests(values)))
    (application,) = deploy.applications
    assert {"autoscaling", "admission"}.isdisjoint(application.args)
    assert "num_replicas" not in application.args["workers"]
    assert {d.name for d in application.deployments} == {INGRESS, WORKERS}


def test_autoscaling_override_keeps_the_current_target():
    """No initial_replicas: Ray 2.60 AutoscalingState.register resets the target to it on every config change."""
    workers = _overrides(_application(None))[WORKERS]
    assert workers["num_replicas"] is None
    assert "initial_replicas" not in workers["autoscaling_config"]
    policy = AutoscalingPolicy(min_replicas=1, max_replicas=4, target_queue_per_replica=4.0, ttft_slo_s=2.0,
                               upscale_delay_s=30.0, downscale_delay_s=300.0, look_back_period_s=30.0)
    # The same Serve config `blendserve serve` gives the policy, less initial_replicas, with only the knobs Serve's
    # config does not carry as the policy's kwargs.
    expected = {k: v for k, v in serve_autoscaling_config(policy).items() if k != "initial_replicas"}
    expected["policy"] = {"policy_function": SERVE_POLICY_PATH, "policy_kwargs": {"ttft_slo_s": 2.0}}
    assert AutoscalingConfig(**workers["autoscaling_config"]) == AutoscalingConfig(**expected)
    assert workers["user_config"] == {"ttft_window_s": 30.0}


def test_admission_travels_as_the_ingress_user_config():
    values = {"config": {"admission": {"max_queued_per_worker": 8}}}
    overrides = _overrides(_application(values))
    assert overrides[INGRESS]["user_config"] == {"admission": {"max_queued_per_worker": 8}}
    # Serve must never hold back what admission let through: one more than the bound per worker replica.
    assert overrides[WORKERS]["max_ongoing_requests"] == 9
    assert overrides[WORKERS]["autoscaling_config"]["target_ongoing_requests"] < 9


def test_fixed_count_is_a_num_replicas_override():
    workers = _overrides(_application(FIXED))[WORKERS]
    assert workers["num_replicas"] == 2 and "autoscaling_config" not in workers


def test_a_window_that_holds_no_two_reports_is_refused():
    """Ray 2.60 only warns; the policy would refuse it in Serve's controller on every tick."""
    values = {"autoscaling": {"policy": {"look_back_period_s": 10.0, "metrics_interval_s": 10.0}}}
    with pytest.raises(helm.HelmRenderError, match="metrics_interval_s .* must be less than look_back_period_s"):
        render(values)


# The HTTP endpoint under both upgrade strategies (KubeRay v1.7.0 common/service.go BuildServeService).

def test_service_port_is_the_port_kuberay_serves_on():
    service = one(manifests({"service": {"port": 80}}), "RayService")
    made = serve_service(service)
    assert made["metadata"]["name"] == "rag-blendserve-serve"
    (port,) = made["spec"]["ports"]
    head = next(container for kind, _, container in pods(service) if kind == "head")
    assert port["port"] == 80 and container_port(head, port["targetPort"]) == 8000


def test_the_ingress_reaches_the_service_kuberay_creates():
    objects = manifests({"ingress": {"enabled": True, "hosts": [
        {"host": "rag.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}]}})
    made = serve_service(one(objects, "RayService"))
    backend = one(objects, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == made["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in made["spec"]["ports"]}


def test_incremental_upgrade_refuses_an_ingress_and_names_the_gateway():
    values = {**INCREMENTAL, "ingress": {"enabled": True, "hosts": [
        {"host": "rag.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}]}}
    with pytest.raises(helm.HelmRenderError, match="Gateway rag-blendserve-gateway"):
        render(values)


@pytest.mark.parametrize("service", [{"port": 80}, {"type": "LoadBalancer"}, {"annotations": {"a": "b"}}])
def test_incremental_upgrade_refuses_service_settings_kuberay_ignores(service: dict):
    with pytest.raises(helm.HelmRenderError, match="service: .*NewClusterWithIncrementalUpgrade"):
        render({**INCREMENTAL, "service": service})


def test_incremental_upgrade_renders_no_serve_service_it_would_ignore():
    objects = manifests(INCREMENTAL)
    assert "serveService" not in one(objects, "RayService")["spec"]
    assert of_kind(objects, "Ingress") == []


# The hot update on a real Ray Serve: Ray's own override and change detection, the chart's serveConfigV2.

STAND_IN = "tests.helm.serve_stand_in:build_app"
REAL_RAY_VALUES = {
    "replica": {"numCpus": 0, "numGpus": 0, "count": 1},
    "workerGroups": [{"name": "cpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 4, "gpus": 0, "cpus": 4,
                      "memory": "16Gi", "shmSize": "2Gi", "runtimeClassName": "", "tolerations": []}],
    "apiKeys": {"enabled": False},
    "kvCache": {"ssd": {"enabled": False}},
    "config": {"engine": {"kind": "torch"}},
    # Fast enough to watch: a TTFT over the SLO adds a replica at once; none is removed within the test.
    "autoscaling": {"enabled": True, "policy": {
        "min_replicas": 1, "max_replicas": 2, "target_queue_per_replica": 4.0, "ttft_slo_s": 1.0,
        "upscale_delay_s": 0.0, "downscale_delay_s": 600.0, "look_back_period_s": 1.0, "metrics_interval_s": 0.2}},
}
REAL_RAY_CHANGE = {
    "autoscaling": {"policy": {"max_replicas": 3, "target_queue_per_replica": 6.0, "upscale_delay_s": 5.0}},
    "config": {"admission": {"max_queued_per_worker": 8}},
}
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def serve_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Ray and Serve on loopback; the controller's client, as the dashboard's PUT handler uses it."""
    from ray.serve.context import _get_global_client

    with local_serve(tmp_path_factory.mktemp("upgrades"), num_cpus=2, object_store_bytes=100 << 20,
                     http_port=free_port()):
        yield _get_global_client()


def _deploy(client: Any, values: dict[str, Any], data_dir: Path) -> None:
    """The chart's serveConfigV2 with a model-free worker deployment, applied as KubeRay's PUT applies it."""
    config = serve_config(manifests(values))
    (application,) = config["applications"]
    application["import_path"] = STAND_IN
    application["args"]["data_dir"] = str(data_dir)
    client.deploy_apps(ServeDeploySchema(**config))


def _details(client: Any) -> dict[str, Any]:
    return client.get_serve_details()["applications"].get("blendserve", {})


def _wait(client: Any, condition: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    details: dict[str, Any] = {}
    while time.monotonic() < deadline:
        details = _details(client)
        if details and condition(details):
            return details
        if details.get("status") in ("DEPLOY_FAILED", "UNHEALTHY"):
            break
        time.sleep(0.2)
    raise AssertionError(f"not within {TIMEOUT_S} s: {what}; status {details.get('status')}: "
                         f"{details.get('message', '')[-2000:]}")


def _replicas(details: dict[str, Any]) -> dict[str, set[tuple[str, str, int]]]:
    """Deployment -> its running replicas as (replica id, actor id, pid)."""
    return {name: {(r["replica_id"], r["actor_id"], r["pid"]) for r in d["replicas"] if r["state"] == "RUNNING"}
            for name, d in details["deployments"].items()}


def _running(details: dict[str, Any], deployment: str) -> int:
    """Running replicas of `deployment` once the app runs (-1 before; a rebuild lists no deployment at first)."""
    found = _replicas(details).get(deployment)
    return len(found) if details["status"] == "RUNNING" and found is not None else -1


def _target(details: dict[str, Any]) -> int:
    return details["deployments"][WORKERS]["target_num_replicas"] if _running(details, WORKERS) >= 0 else -1


def test_a_hot_upgrade_keeps_every_replica_and_the_target(serve_client: Any, tmp_path: Path):
    from ray import serve

    _deploy(serve_client, REAL_RAY_VALUES, tmp_path)
    _wait(serve_client, lambda d: _running(d, WORKERS) == 1, "the app runs one worker replica")
    workers = serve.get_deployment_handle(WORKERS, "blendserve")

    def slow_and_scaled(details: dict[str, Any]) -> bool:
        workers.observe.remote(5.0).result()  # a TTFT far over the 1 s SLO, until a second replica runs
        return _running(details, WORKERS) == 2

    _wait(serve_client, slow_and_scaled, "a TTFT over the SLO adds a worker replica")
    before = _wait(serve_client, lambda d: _target(d) == 2, "a target of 2")
    assert len(_replicas(before)[INGRESS]) == 1  # one ingress replica: /metrics through any proxy is its own
    time.sleep(2.0)  # the slow TTFTs leave the 1 s window: nothing pushes the target up from here on

    _deploy(serve_client, _merged(REAL_RAY_VALUES, REAL_RAY_CHANGE), tmp_path)

    def updated(details: dict[str, Any]) -> bool:
        if _running(details, WORKERS) < 0:
            return False
        config = details["deployments"][WORKERS]["deployment_config"]
        return config["autoscaling_config"]["max_replicas"] == 3 and config["max_ongoing_requests"] == 9

    after = _wait(serve_client, updated, "the new autoscaling bounds and admission limit applied")
    assert _replicas(after) == _replicas(before)  # the same replica actors, in the same processes
    assert _target(after) == 2
    ingress_config = after["deployments"][INGRESS]["deployment_config"]["user_config"]
    assert ingress_config == {"admission": {"max_queued_per_worker": 8}}
