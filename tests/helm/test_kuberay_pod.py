"""The replay's copy of KubeRay's pod building gives what KubeRay v1.7.0's own tests expect (pod_test.go)."""
from tests.helm import kuberay_pod as kuberay

GCS = "raycluster-sample-head-svc.default.svc.cluster.local:6379"


def _command(params: dict[str, str], head: bool, limits: dict[str, str]) -> list[str]:
    """The container's argument split into sorted words, as pod_test.go's splitAndSort compares them."""
    done = kuberay.with_resources(kuberay.complete_params(params, head, GCS, autoscaling=False),
                                  {"resources": {"limits": limits}})
    return sorted(kuberay.container_args(kuberay.ray_start_command(done, head))[-1].split())


def test_worker_command_is_the_one_kuberay_builds():
    # TestBuildPod: a worker with port=6379 in rayStartParams, limits cpu 1, memory 1Gi, nvidia.com/gpu 3.
    expected = ("ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; ray start --block "
                "--dashboard-agent-listen-port=52365 --memory=1073741824 --num-cpus=1 --num-gpus=3 "
                f"--address={GCS} --port=6379 --metrics-export-port=8080")
    limits = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "3"}
    assert _command({"port": "6379"}, False, limits) == sorted(expected.split())


def test_head_command_is_the_one_kuberay_builds():
    expected = ("ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; ray start --head --block "
                "--dashboard-agent-listen-port=52365 --memory=1073741824 --num-cpus=1 --metrics-export-port=8080 "
                "--dashboard-host=0.0.0.0")
    assert _command({}, True, {"cpu": "1", "memory": "1Gi"}) == sorted(expected.split())


def test_false_flags_are_dropped_and_autoscaling_turns_the_monitor_off():
    params = kuberay.complete_params({"include-dashboard": "false", "disable-usage-stats": "false"}, True, "", True)
    command = kuberay.ray_start_command(params, True)
    assert "--include-dashboard=false" in command  # one of the flags whose false is passed on
    assert "disable-usage-stats" not in command
    assert "--no-monitor" in command


def test_probes_are_injected_only_where_the_container_sets_none():
    params = kuberay.complete_params({}, False, GCS, False)
    worker = kuberay.injected_probes({"ports": [{"name": "serve", "containerPort": 8000}]}, params, head=False)
    assert worker["livenessProbe"]["httpGet"] == {"path": "/api/healthz", "port": 52365}
    (command,) = worker["readinessProbe"]["exec"]["command"][-1:]
    assert "http://localhost:52365/api/local_raylet_healthz" in command
    assert "http://localhost:8000/-/healthz" in command
    assert worker["readinessProbe"]["failureThreshold"] == 1
    head = kuberay.injected_probes({}, kuberay.complete_params({}, True, "", False), head=True)
    assert head["readinessProbe"]["httpGet"] == {"path": "/api/healthz", "port": 52365}
    own = {"httpGet": {"path": "/readyz", "port": "serve"}}
    assert kuberay.injected_probes({"readinessProbe": own}, params, head=True)["readinessProbe"] == own


def test_labels_keep_kuberays_own_and_a_rayservice_head_starts_out_of_the_serve_service():
    labels = kuberay.pod_labels({"app.kubernetes.io/name": "blendserve", "ray.io/group": "mine"}, "rag-x", True,
                                kuberay.HEAD_GROUP)
    assert labels["app.kubernetes.io/name"] == "blendserve"
    assert labels["ray.io/group"] == kuberay.HEAD_GROUP
    assert labels["ray.io/serve"] == "false"
    assert kuberay.pod_labels({}, "rag-x", False, "cpu")["ray.io/serve"] == "true"
