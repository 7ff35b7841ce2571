"""Bad values are refused before anything renders: by values.schema.json, or by the chart's own checks."""
import json

import helm_python as helm
import jsonschema
import pytest
import yaml

from cluster.config import ServeConfig
from scheduler.autoscaling import AutoscalingPolicy
from tests.helm.rendering import CHART_DIR, render

GPU_GROUP = {"name": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 4, "gpus": 1, "cpus": 8,
             "memory": "48Gi", "shmSize": "8Gi"}


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"workerGroups": [{**GPU_GROUP, "minReplicas": -1}]}, "/workerGroups/0/minReplicas"),  # negative replicas
        ({"replica": {"numCpus": 1, "numGpus": 1, "count": 0}}, "/replica/count"),
        ({"autoscaling": {"enabled": "yes"}}, "/autoscaling/enabled"),  # wrong type
        ({"workerGroups": [{**GPU_GROUP, "cpus": "8"}]}, "/workerGroups/0/cpus"),
        ({"replcia": {"count": 2}}, "'replcia' not allowed"),  # a typo at the top
        ({"workerGroups": [{**GPU_GROUP, "minReplica": 2}]}, "'minReplica' not allowed"),  # a typo in a group
        ({"autoscaling": {"enabled": True, "policy": {"ttft_slo": 1.0}}}, "'ttft_slo' not allowed"),
        ({"config": {"fusoin": {"recompute_ratio": 0.2}}}, "'fusoin' not allowed"),  # a config section misspelt
        ({"config": {"tiers": []}}, "/config/tiers"),  # the chart decides the tiers from kvCache
        ({"config": {"server": {"api_keys": {"sk-inline-key": "acme"}}}}, "/config/server/api_keys"),  # keys inline
        ({"workerGroups": [{**GPU_GROUP, "memory": "48GB"}]}, "/workerGroups/0/memory"),  # not a quantity
        ({"kvCache": {"ram": {"memoryFraction": 1.5}}}, "/kvCache/ram/memoryFraction"),
        ({"workerGroups": []}, "/workerGroups"),
        ({"workerGroups": [{**GPU_GROUP, "name": "GPU_pool"}]}, "/workerGroups/0/name"),
        ({"upgradeStrategy": {"type": "Rolling"}}, "/upgradeStrategy/type"),
        ({"image": {"repository": "blendserve", "tag": "1", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"service": {"port": 70000}}, "/service/port"),
        ({"probes": {"readiness": {"periodSeconds": 5}}}, "'probes' not allowed"),  # KubeRay's probes are kept
        ({"podSecurityContext": {"runAsUser": "1000"}}, "/podSecurityContext/runAsUser"),
        ({"model": {"provision": "download"}}, "/model/provision"),
        ({"workerGroups": [{**GPU_GROUP, "gpuMemory": "80GB"}]}, "/workerGroups/0/gpuMemory"),
        ({"workerGroups": [{**GPU_GROUP, "topologySpreadConstraints": [{"maxSkew": 1}]}]},
         "/workerGroups/0/topologySpreadConstraints/0"),  # topologyKey and whenUnsatisfiable missing
    ],
)
def test_the_schema_refuses_bad_values(values: dict, words: str):
    with pytest.raises(helm.HelmValuesError, match=words.replace("[", r"\[")):
        render(values)
    report = helm.lint(CHART_DIR, values, strict=True)
    assert report["errors"] or any(m["severity"] >= 2 for m in report["messages"])


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"autoscaling": {"enabled": True, "policy": {"max_replicas": 9}}},
         "fewer than autoscaling.policy.max_replicas"),
        ({"replica": {"numCpus": 1, "numGpus": 1, "count": 5}}, "replica.count"),
        ({"workerGroups": [{**GPU_GROUP, "gpus": 0}]}, "gpus is 0 but replica.numGpus is 1"),
        ({"kvCache": {"object": {"enabled": True}}}, "kvCache.object.url"),
        ({"kvCache": {"object": {"enabled": True, "url": "s3://b/p", "credentials": {"create": {"enabled": True}}}}},
         "accessKeyId is required"),
        ({"apiKeys": {"metricsRequireKey": True}, "metrics": {"serviceMonitor": {"enabled": True}}},
         "bearerTokenSecret.name is required"),
        # Keys the chart sets itself would render twice in rayStartParams.
        ({"head": {"rayStartParams": {"num-cpus": "4"}}}, r"head.rayStartParams.num-cpus is set by the chart"),
        ({"head": {"rayStartParams": {"dashboard-host": "127.0.0.1"}}}, "head.rayStartParams.dashboard-host"),
        ({"head": {"rayStartParams": {"metrics-export-port": "9090"}}}, "use metrics.rayMetricsPort instead"),
        ({"head": {"rayStartParams": {"redis-password": "x"}}}, "use head.gcsFaultTolerance instead"),
        ({"workerGroups": [{**GPU_GROUP, "rayStartParams": {"num-gpus": "2"}}]},
         r"workerGroups\[gpu\].rayStartParams.num-gpus is set by the chart: use workerGroups\[\].gpus instead"),
        ({"workerGroups": [{**GPU_GROUP, "rayStartParams": {"num-cpus": "2"}}]}, r"use workerGroups\[\].cpus instead"),
        ({"workerGroups": [{**GPU_GROUP, "minReplicas": 3, "maxReplicas": 2}]},
         r"workerGroups\[gpu\]: minReplicas \(3\) is greater than maxReplicas \(2\)"),
        ({"workerGroups": [{**GPU_GROUP, "replicas": 5}]},
         r"workerGroups\[gpu\]: replicas \(5\) must lie within \[1, 4\]"),
        ({"head": {"gcsFaultTolerance": {"enabled": True}}}, "head.gcsFaultTolerance.redisAddress is required"),
        ({"model": {"provision": "fetch"}}, "model.fetch.url"),
        ({"model": {"provision": "volume"}}, "model.volume.claimName"),
        ({"model": {"provision": "fetch", "fetch": {"url": "s3://m/llama"}}, "config": {"model": {"path": "/m"}}},
         "config.model.path is set by model.provision"),
        # vLLM claims gpu_memory_utilization of the whole GPU at start-up; the device tier comes on top of it.
        ({"config": {"engine": {"vllm": {"gpu_memory_utilization": 0.9}}}, "kvCache": {"device": {"capacity": "16Gi"}}},
         r"workerGroups\[gpu\]: .*needs 88.0Gi of GPU memory, more than gpuMemory \(80Gi\)"),
        ({"replica": {"numCpus": 1, "numGpus": 0.5, "count": 1},
          "config": {"engine": {"vllm": {"gpu_memory_utilization": 0.46}}}}, r"x 2 replicas per GPU"),
    ],
)
def test_the_chart_refuses_values_it_cannot_serve(values: dict, words: str):
    with pytest.raises(helm.HelmRenderError, match=words):
        render(values)


def test_defaults_pass_the_schema_in_another_validator_too():
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load((CHART_DIR / "values.yaml").read_text()))


def test_schema_knows_the_config_sections_and_the_policy_fields():
    """A section or policy field added to blendserve must be added here too, or the chart would refuse it."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())["properties"]
    assert set(schema["config"]["properties"]) == set(ServeConfig.__dataclass_fields__)
    policy = schema["autoscaling"]["properties"]["policy"]["properties"]
    assert set(policy) == set(AutoscalingPolicy.__dataclass_fields__)
