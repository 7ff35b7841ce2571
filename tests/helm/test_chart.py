"""The chart renders and lints with a real Helm engine; every manifest passes the schemas the API server applies."""
import base64
import json
import math

import helm_python as helm
import pytest
import yaml
from ray.serve.config import AutoscalingConfig
from ray.serve.schema import ServeDeploySchema

from cluster.config import config_from_dict
from scheduler.autoscaling import SERVE_POLICY_PATH
from tests.helm.rendering import (
    CHART_DIR,
    PROMETHEUS_OPERATOR_KINDS,
    app_args,
    manifests,
    of_kind,
    one,
    pods_of,
    ray_cluster_of,
    render,
    serve_config,
    validate_core,
    validate_kuberay,
)

GiB = 1 << 30
CPU_WORKERS = {
    "replica": {"numCpus": 2, "numGpus": 0, "count": 2},
    "workerGroups": [{
        "name": "cpu", "replicas": 2, "minReplicas": 2, "maxReplicas": 2, "gpus": 0, "cpus": 4,
        "memory": "16Gi", "shmSize": "2Gi", "runtimeClassName": "", "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "tolerations": [],
    }],
    "config": {"engine": {"kind": "vllm", "vllm": {"device": "cpu"}}, "fusion": {"recompute_ratio": 0.2}},
    "autoscaling": {"enabled": False},
    "apiKeys": {"enabled": False},
    "kvCache": {"ssd": {"volume": "emptyDir", "capacity": "20Gi"}},
}
S3_AND_MONITORING = {
    "kvCache": {
        "object": {
            "enabled": True, "url": "s3://kvcache/blendserve", "capacity": "2Ti",
            "endpointUrl": "http://minio.storage:9000", "region": "eu-west-1",
            "credentials": {"existingSecret": "s3-creds"},
        },
        "ssd": {"volume": "hostPath", "hostPath": "/mnt/nvme/blendserve"},
    },
    "apiKeys": {"existingSecret": "rag-keys", "secretKey": "keys.yaml", "metricsRequireKey": True},
    "ingress": {
        "enabled": True, "className": "nginx",
        "hosts": [{"host": "rag.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
        "tls": [{"secretName": "rag-tls", "hosts": ["rag.example.com"]}],
    },
    "metrics": {
        "serviceMonitor": {"enabled": True, "bearerTokenSecret": {"name": "prometheus-key", "key": "token"}},
        "podMonitor": {"enabled": True},
    },
    "config": {"model": {"path": "/models/Llama-3.1-8B-Instruct", "name": "llama-3.1-8b"}},
    "extraVolumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}],
    "extraVolumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
}
TWO_GPU_GROUPS_CREATED_SECRET = {
    "workerGroups": [
        {"name": "a100", "replicas": 1, "minReplicas": 1, "maxReplicas": 2, "gpus": 2, "cpus": 16, "memory": "128Gi",
         "shmSize": "16Gi", "runtimeClassName": "nvidia", "nodeSelector": {"gpu": "a100"}},
        {"name": "l4", "replicas": 0, "minReplicas": 0, "maxReplicas": 4, "gpus": 1, "cpus": 8, "memory": "32Gi",
         "shmSize": "8Gi", "runtimeClassName": "nvidia",
         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
             {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["l4"]}]}]}}}},
    ],
    "autoscaling": {"policy": {"min_replicas": 1, "max_replicas": 8, "ttft_slo_s": 1.5, "max_step_up": 1}},
    "kvCache": {
        "object": {"enabled": True, "url": "s3://kvcache/prod", "credentials": {"create": {
            "enabled": True, "accessKeyId": "AKIAEXAMPLEKEY", "secretAccessKey": "example-secret-access-key"}}},
        "ssd": {"storageClassName": "local-nvme"},
    },
    "upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
        "gatewayClassName": "istio", "stepSizePercent": 25, "intervalSeconds": 60}},
    "helmTest": {"url": "http://rag-blendserve-gateway.ai"},  # no stable Service under incremental upgrades
}
EVERYTHING_OFF = {
    "autoscaling": {"enabled": False},
    "kvCache": {"ssd": {"enabled": False}},
    "podDisruptionBudget": {"enabled": False},
    "metrics": {"grafanaDashboard": {"enabled": False}},
    "apiKeys": {"enabled": False},
}
MODEL_FETCH_HA_HEAD = {
    "model": {
        "provision": "fetch", "mountPath": "/models/llama",
        "fetch": {"url": "s3://models/llama-3.1-8b", "endpointUrl": "http://minio.storage:9000", "region": "eu-west-1",
                  "credentials": {"existingSecret": "model-creds"}},
        "volume": {"type": "emptyDir", "sizeLimit": "40Gi"},
    },
    "head": {"gcsFaultTolerance": {"enabled": True, "redisAddress": "redis.ray:6379",
                                   "redisPassword": {"existingSecret": "redis", "key": "password"}}},
    "podDisruptionBudget": {"head": {"enabled": True}},
}
VALUE_SETS = {
    "defaults": None,
    "cpu-workers-keys-off": CPU_WORKERS,
    "s3-existing-secret-monitoring": S3_AND_MONITORING,
    "two-gpu-groups-s3-created-secret": TWO_GPU_GROUPS_CREATED_SECRET,
    "everything-off": EVERYTHING_OFF,
    "model-fetch-ha-head": MODEL_FETCH_HA_HEAD,
}


@pytest.fixture(scope="module", params=list(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> tuple[dict | None, list[dict]]:
    values = VALUE_SETS[request.param]
    return values, manifests(values)


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_strict_lint_passes(name: str):
    report = helm.lint(CHART_DIR, VALUE_SETS[name], strict=True)
    assert report["errors"] == []
    # Info only (severity 1: "icon is recommended"); strict lint fails on any warning or error.
    assert all(message["severity"] <= 1 for message in report["messages"]), report["messages"]


def test_every_manifest_passes_its_schema(rendered):
    _, objects = rendered
    kinds = {o["kind"] for o in objects}
    assert "RayService" in kinds
    for obj in objects:
        if obj["apiVersion"].startswith("ray.io/"):
            validate_kuberay(obj)
        elif obj["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"  # no schema offline: docs/deploy.md says so
        else:
            validate_core(obj)
    cluster = ray_cluster_of(one(objects, "RayService"))
    validate_kuberay(cluster)
    for pod in pods_of(cluster):
        validate_core(pod)


def test_the_kuberay_schema_refuses_unknown_fields():
    service = one(manifests(), "RayService")
    service["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParam"] = {}
    with pytest.raises(Exception, match="rayStartParam"):
        validate_kuberay(service)


def test_serve_config_is_accepted_by_ray_and_by_blendserve(rendered):
    _, objects = rendered
    deploy = ServeDeploySchema(**serve_config(objects))
    (application,) = deploy.applications
    assert application.import_path == "cluster.app:build_app" and application.route_prefix == "/"
    assert deploy.http_options.host == "0.0.0.0" and deploy.http_options.port == 8000
    config = config_from_dict(application.args)
    assert config.server.host == "0.0.0.0"
    assert str(config.data_dir) == "/data/blendserve"


def test_head_runs_no_model_and_workers_hold_whole_replicas(rendered):
    values, objects = rendered
    cluster = one(objects, "RayService")["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["rayStartParams"]
    assert head["num-gpus"] == "0" and head["num-cpus"] == "0"
    config = config_from_dict(app_args(objects))
    for group in cluster["workerGroupSpecs"]:
        (container,) = group["template"]["spec"]["containers"]
        gpus = int(group["rayStartParams"]["num-gpus"])
        assert container["resources"]["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        if config.workers.num_gpus:
            assert gpus >= config.workers.num_gpus
            assert group["template"]["spec"]["runtimeClassName"] == "nvidia"
        else:
            assert int(group["rayStartParams"]["num-cpus"]) >= config.workers.num_cpus


def test_gpu_and_cpu_groups_follow_their_values():
    gpu = one(manifests(), "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert gpu["template"]["spec"]["tolerations"] == [toleration]
    assert gpu["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    cpu = one(manifests(CPU_WORKERS), "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert "runtimeClassName" not in cpu["template"]["spec"]
    assert cpu["template"]["spec"]["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    assert "nvidia.com/gpu" not in cpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert (cpu["replicas"], cpu["minReplicas"], cpu["maxReplicas"]) == (2, 2, 2)


def test_tiers_are_sized_from_the_pods():
    tiers = {t["name"]: t for t in app_args(manifests(TWO_GPU_GROUPS_CREATED_SECRET))["tiers"]}
    assert tiers["device"]["capacity_bytes"] == 4 * GiB
    assert tiers["ram"]["capacity_bytes"] == 32 * GiB // 4  # a quarter of the smallest pod's 32Gi
    assert tiers["ssd"]["capacity_bytes"] == math.floor(100 * GiB * 0.9)
    assert tiers["ssd"]["url"] == "file:///data/blendserve/kv"
    assert tiers["object"]["url"] == "s3://kvcache/prod"
    assert set(tiers) == {"device", "ram", "ssd", "object"}
    assert {t["name"] for t in app_args(manifests(EVERYTHING_OFF))["tiers"]} == {"device", "ram"}
    assert {t["compression"] for t in tiers.values()} == {"none"}


def test_each_tier_takes_its_compression_and_blendserve_accepts_it():
    values = {"kvCache": {"ram": {"compression": "int4"}, "ssd": {"compression": "int8"}}}
    args = app_args(manifests(values))
    assert {t["name"]: t["compression"] for t in args["tiers"]} == {"device": "none", "ram": "int4", "ssd": "int8"}
    config = config_from_dict({**args, "data_dir": "/tmp/bs-chart"})
    assert config.tier("ssd").to_spec().compression == "int8"


@pytest.mark.parametrize(
    ("values", "volume"),
    [(None, "ephemeral"), (CPU_WORKERS, "emptyDir"), (S3_AND_MONITORING, "hostPath"), (EVERYTHING_OFF, "emptyDir")],
)
def test_the_ssd_tier_is_a_volume_of_each_pod(values, volume):
    for group in one(manifests(values), "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        (data,) = [v for v in group["template"]["spec"]["volumes"] if v["name"] == "data"]
        assert volume in data
        (container,) = group["template"]["spec"]["containers"]
        assert {"name": "data", "mountPath": "/data/blendserve"} in container["volumeMounts"]


def _pod_specs(objects: list[dict]) -> list[dict]:
    """The head's pod spec, then each worker group's."""
    cluster = one(objects, "RayService")["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]


def _env_of_workers(objects: list[dict]) -> list[list[dict]]:
    groups = one(objects, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return [g["template"]["spec"]["containers"][0].get("env", []) for g in groups]


def test_object_store_credentials_come_from_a_secret_never_inline():
    objects = manifests(S3_AND_MONITORING)
    args = app_args(objects)
    (tier,) = [t for t in args["tiers"] if t["name"] == "object"]
    assert tier["storage_options"] == {"client_kwargs": {"endpoint_url": "http://minio.storage:9000"}}
    for env in _env_of_workers(objects):
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs["AWS_ACCESS_KEY_ID"] == {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}
        assert refs["AWS_SECRET_ACCESS_KEY"] == {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"}
        assert {"name": "AWS_DEFAULT_REGION", "value": "eu-west-1"} in env
    created = manifests(TWO_GPU_GROUPS_CREATED_SECRET)
    (secret,) = [s for s in of_kind(created, "Secret") if s["metadata"]["name"].endswith("-object-store")]
    assert base64.b64decode(secret["data"]["AWS_SECRET_ACCESS_KEY"]).decode() == "example-secret-access-key"
    service_text = render(TWO_GPU_GROUPS_CREATED_SECRET)["blendserve/templates/rayservice.yaml"]
    assert "example-secret-access-key" not in service_text and "AKIAEXAMPLEKEY" not in service_text
    for env in _env_of_workers(created):
        secret_refs = [e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})]
        assert len(secret_refs) == 2 and {ref["name"] for ref in secret_refs} == {secret["metadata"]["name"]}


def test_api_keys_come_from_a_secret_mounted_as_the_configured_file():
    objects = manifests()
    (secret,) = of_kind(objects, "Secret")
    keys = yaml.safe_load(base64.b64decode(secret["data"]["api_keys.yaml"]))
    ((key, tenant),) = keys.items()
    assert tenant == "default" and len(key) >= 32
    server = app_args(objects)["server"]
    assert server["api_keys_file"] == "/etc/blendserve/api-keys/api_keys.yaml"
    mount = {"name": "api-keys", "mountPath": "/etc/blendserve/api-keys", "readOnly": True}
    for spec in _pod_specs(objects):
        (volume,) = [v for v in spec["volumes"] if v["name"] == "api-keys"]
        assert volume["secret"]["secretName"] == secret["metadata"]["name"]
        assert mount in spec["containers"][0]["volumeMounts"]
    existing = manifests(S3_AND_MONITORING)
    assert of_kind(existing, "Secret") == []  # the user's own Secret is used, not made
    assert app_args(existing)["server"]["api_keys_file"] == "/etc/blendserve/api-keys/keys.yaml"


def test_keys_off_serves_open_and_mounts_nothing():
    objects = manifests(CPU_WORKERS)
    assert app_args(objects)["server"]["allow_unauthenticated"] is True
    assert "api_keys_file" not in app_args(objects)["server"]
    assert of_kind(objects, "Secret") == []
    cluster = one(objects, "RayService")["spec"]["rayClusterConfig"]
    assert all(v["name"] != "api-keys" for v in cluster["headGroupSpec"]["template"]["spec"]["volumes"])


def _worker_override(objects: list[dict]) -> dict:
    """The worker deployment's entry in serveConfigV2's deployment overrides."""
    (application,) = serve_config(objects)["applications"]
    (workers,) = [d for d in application["deployments"] if d["name"] == "WorkerDeployment"]
    return workers


def test_autoscaling_on_drives_serve_with_the_blendserve_policy_and_the_ray_autoscaler():
    objects = manifests(TWO_GPU_GROUPS_CREATED_SECRET)
    cluster = one(objects, "RayService")["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"]["idleTimeoutSeconds"] == 120
    serve = AutoscalingConfig(**_worker_override(objects)["autoscaling_config"])
    assert (serve.min_replicas, serve.max_replicas) == (1, 8)
    assert serve.policy.policy_function == SERVE_POLICY_PATH
    assert serve.policy.policy_kwargs["ttft_slo_s"] == 1.5 and serve.policy.policy_kwargs["max_step_up"] == 1
    assert [(g["minReplicas"], g["maxReplicas"]) for g in cluster["workerGroupSpecs"]] == [(1, 2), (0, 4)]


def test_autoscaling_off_runs_a_fixed_count():
    objects = manifests(CPU_WORKERS)
    cluster = one(objects, "RayService")["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is False and "autoscalerOptions" not in cluster
    workers = _worker_override(objects)
    assert workers["num_replicas"] == 2 and "autoscaling_config" not in workers


def test_ray_containers_leave_their_probes_to_kuberay(rendered):
    """KubeRay submits the app only once the head is Ready: a probe through the Serve proxy would wait forever."""
    _, objects = rendered
    for spec in _pod_specs(objects):
        for container in spec["containers"] + spec.get("initContainers", []):
            assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(container), container["name"]
    pods = json.dumps(_pod_specs(objects))
    assert "/readyz" not in pods and "/healthz" not in pods
    # KubeRay's worker readiness probe asks the Serve proxy on the containerPort named `serve`.
    http_port = serve_config(objects)["http_options"]["port"]
    for spec in _pod_specs(objects):
        assert {"name": "serve", "containerPort": http_port} in spec["containers"][0]["ports"]


def test_service_ingress_pdb_and_monitors():
    objects = manifests(S3_AND_MONITORING)
    service = one(objects, "RayService")["spec"]["serveService"]
    assert service["metadata"]["name"] == "rag-blendserve-serve"
    (ingress,) = of_kind(objects, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "rag-blendserve-serve", "port": {"name": "serve"}}
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"] == {"name": "prometheus-key", "key": "token"}
    assert one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "interval": "30s"}]
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    assert of_kind(manifests(EVERYTHING_OFF), "PodDisruptionBudget") == []


def test_upgrade_strategy_passes_through():
    spec = one(manifests(TWO_GPU_GROUPS_CREATED_SECRET), "RayService")["spec"]
    assert spec["upgradeStrategy"]["type"] == "NewClusterWithIncrementalUpgrade"
    assert spec["upgradeStrategy"]["clusterUpgradeOptions"]["stepSizePercent"] == 25
    assert one(manifests(), "RayService")["spec"]["upgradeStrategy"] == {"type": "NewCluster"}


def test_notes_say_how_to_call_the_endpoint():
    notes = render()["blendserve/templates/NOTES.txt"]
    assert "curl -s 127.0.0.1:8000/v1/chat/completions" in notes
    assert "from openai import OpenAI" in notes
    assert "kubectl -n ai port-forward svc/rag-blendserve-serve 8000:8000" in notes


def test_extra_volumes_reach_every_pod():
    for spec in _pod_specs(manifests(S3_AND_MONITORING)):
        assert {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in spec["volumes"]
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in spec["containers"][0]["volumeMounts"]


POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 100, "fsGroup": 100,
                "fsGroupChangePolicy": "OnRootMismatch"}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                      "seccompProfile": {"type": "RuntimeDefault"}}


def test_pods_run_as_the_image_user_without_privileges():
    objects = manifests(MODEL_FETCH_HA_HEAD)
    for spec in _pod_specs(objects):
        assert spec["securityContext"] == POD_SECURITY
        for container in spec["containers"] + spec["initContainers"]:
            assert container["securityContext"] == CONTAINER_SECURITY, container["name"]
    cluster = one(objects, "RayService")["spec"]["rayClusterConfig"]
    assert cluster["autoscalerOptions"]["securityContext"] == CONTAINER_SECURITY
    own = manifests({"podSecurityContext": {"runAsUser": 2000}, "securityContext": {"readOnlyRootFilesystem": False}})
    for spec in _pod_specs(own):
        assert spec["securityContext"]["runAsUser"] == 2000 and spec["securityContext"]["fsGroup"] == 100
        assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


def test_every_ray_container_knows_its_node_name(rendered):
    _, objects = rendered
    node_name = {"name": "BLENDSERVE_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    for spec in _pod_specs(objects):
        assert node_name in spec["containers"][0]["env"]


def test_disruption_budgets_let_unready_pods_go_and_guard_the_head_when_asked():
    (workers,) = of_kind(manifests(), "PodDisruptionBudget")
    assert workers["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a worker without a replica is never Ready
    assert "gcsFaultToleranceOptions" not in one(manifests(), "RayService")["spec"]["rayClusterConfig"]
    objects = manifests(MODEL_FETCH_HA_HEAD)
    budgets = {b["metadata"]["name"]: b["spec"] for b in of_kind(objects, "PodDisruptionBudget")}
    head = budgets["rag-blendserve-head"]
    assert head["maxUnavailable"] == 0 and head["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert head["selector"]["matchLabels"]["app.kubernetes.io/component"] == "head"
    assert budgets["rag-blendserve-workers"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    options = one(objects, "RayService")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert options == {"redisAddress": "redis.ray:6379",
                       "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "redis", "key": "password"}}}}


def test_worker_pods_spread_over_nodes_unless_told_otherwise():
    groups = one(manifests(TWO_GPU_GROUPS_CREATED_SECRET), "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    for group in groups:
        assert group["template"]["spec"]["topologySpreadConstraints"] == [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {
                "app.kubernetes.io/name": "blendserve", "app.kubernetes.io/instance": "rag",
                "app.kubernetes.io/component": "worker", "blendserve/worker-group": group["groupName"]}},
        }]
    zones = {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"tier": "gpu"}}}
    values = {"workerGroups": [{**group, "topologySpreadConstraints": spread} for group, spread in
                               zip(TWO_GPU_GROUPS_CREATED_SECRET["workerGroups"], [[zones], []], strict=True)]}
    cluster = ray_cluster_of(one(manifests(values), "RayService"))
    zoned, unspread = cluster["spec"]["workerGroupSpecs"]
    assert zoned["template"]["spec"]["topologySpreadConstraints"] == [zones]
    assert "topologySpreadConstraints" not in unspread["template"]["spec"]
    for pod in pods_of(cluster):
        validate_core(pod)


def test_the_model_is_fetched_into_every_pod_before_ray_starts():
    objects = manifests(MODEL_FETCH_HA_HEAD)
    assert app_args(objects)["model"]["path"] == "/models/llama"
    for spec in _pod_specs(objects):  # the head too: the ingress reads the tokenizer
        (fetch,) = spec["initContainers"]
        assert fetch["command"] == ["blendserve", "fetch-model", "s3://models/llama-3.1-8b", "/models/llama",
                                    "--endpoint-url", "http://minio.storage:9000", "--region", "eu-west-1"]
        assert fetch["image"] == spec["containers"][0]["image"]
        assert fetch["volumeMounts"] == [{"name": "model", "mountPath": "/models/llama"}]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in fetch["env"]}
        assert refs == {"AWS_ACCESS_KEY_ID": {"name": "model-creds", "key": "AWS_ACCESS_KEY_ID"},
                        "AWS_SECRET_ACCESS_KEY": {"name": "model-creds", "key": "AWS_SECRET_ACCESS_KEY"}}
        assert {"name": "model", "emptyDir": {"sizeLimit": "40Gi"}} in spec["volumes"]
        assert {"name": "model", "mountPath": "/models/llama", "readOnly": True} in spec["containers"][0][
            "volumeMounts"]
    mounted = {"model": {"provision": "volume", "mountPath": "/models/qwen",
                         "volume": {"type": "persistentVolumeClaim", "claimName": "qwen-weights"}}}
    objects = manifests(mounted)
    assert app_args(objects)["model"]["path"] == "/models/qwen"
    for spec in _pod_specs(objects):
        assert "initContainers" not in spec
        claim = {"claimName": "qwen-weights", "readOnly": True}
        assert {"name": "model", "persistentVolumeClaim": claim} in spec["volumes"]
    assert "initContainers" not in _pod_specs(manifests())[0]


def test_a_vllm_share_and_device_tier_that_fit_the_gpu_render():
    # Two replicas per GPU (0.5 each): 2 x (0.45 x 80Gi + 4Gi) = 80Gi, exactly the GPU.
    values = {"replica": {"numCpus": 1, "numGpus": 0.5, "count": 1}, "workerGroups": [{**TWO_GPU_GROUPS_CREATED_SECRET[
        "workerGroups"][1], "gpuMemory": "80Gi"}], "config": {"engine": {"vllm": {"gpu_memory_utilization": 0.45}}}}
    assert app_args(manifests(values))["engine"]["vllm"]["gpu_memory_utilization"] == 0.45
    assert one(manifests(), "RayService")  # the defaults: 0.3 x 80Gi + 4Gi on one GPU
