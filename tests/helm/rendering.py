"""The chart rendered by the real Helm engine, and the KubeRay CRD schemas made as strict as the API server."""
import copy
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "blendserve"
CRD_DIR = REPO.parent / "shared" / "k8s"
RELEASE = "rag"
NAMESPACE = "ai"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest kubernetes-validate knows.
KUBE_VERSIONS = ("1.27.0", kubernetes_validate.utils.latest_version())
KUBERAY_KINDS = {"RayService": "ray.io_rayservices.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor"}


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` makes it (values checked by the chart's schema)."""
    with helm.Chart.load(CHART_DIR) as chart:
        return chart.render(values, name=RELEASE, namespace=NAMESPACE)


def manifests(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (NOTES.txt is text for the user, not a manifest)."""
    found = []
    for path, text in sorted(render(values).items()):
        if not path.endswith(".yaml"):
            continue
        found.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return found


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = of_kind(objects, kind)
    return found


def serve_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The RayService's serveConfigV2, parsed."""
    return yaml.safe_load(one(objects, "RayService")["spec"]["serveConfigV2"])


def app_args(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The blendserve configuration the chart hands `cluster.app:build_app`."""
    (application,) = serve_config(objects)["applications"]
    return application["args"]


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever it lists properties and does not preserve unknown ones."""
    if isinstance(schema, dict):
        strict = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            strict["additionalProperties"] = False
        return strict
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    """openAPIV3Schema of the served ray.io/v1 version of the KubeRay CRD, made strict."""
    # The CRDs are ~2 MB of YAML: libyaml's loader parses them ~10x faster than the pure-Python one.
    crd = yaml.load((CRD_DIR / KUBERAY_KINDS[kind]).read_text(), Loader=yaml.CSafeLoader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _strict(version["schema"]["openAPIV3Schema"])


def validate_kuberay(obj: dict[str, Any]) -> None:
    """Refuse what the API server would refuse: wrong types, missing required fields, unknown fields."""
    assert obj["apiVersion"] == "ray.io/v1"
    jsonschema.Draft7Validator(crd_schema(obj["kind"])).validate(obj)


def validate_core(obj: dict[str, Any]) -> None:
    """kubernetes-validate --strict against each supported Kubernetes version."""
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def ray_cluster_of(service: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster KubeRay makes from a RayService's rayClusterConfig."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": f"{service['metadata']['name']}-raycluster", "labels": service["metadata"]["labels"]},
        "spec": copy.deepcopy(service["spec"]["rayClusterConfig"]),
    }


def pods_of(cluster: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Each group's pod template as a v1 Pod, for the core schema."""
    spec = cluster["spec"]
    groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]
    for name, group in groups:
        template = group["template"]
        yield {"apiVersion": "v1", "kind": "Pod", "metadata": {**template.get("metadata", {}), "name": name},
               "spec": template["spec"]}


def dashboard(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The Grafana dashboard the chart ships, from its ConfigMap."""
    (config_map,) = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    (text,) = config_map["data"].values()
    return json.loads(text)


_METRIC = re.compile(r"\b(blendserve_[a-z0-9_]+)\s*(?:\{([^}]*)\})?")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def dashboard_queries(board: dict[str, Any]) -> list[str]:
    """The PromQL of every panel target, rows excluded."""
    return [target["expr"] for panel in board["panels"] if panel["type"] != "row" for target in panel["targets"]]


def metric_references(expr: str) -> list[tuple[str, set[str]]]:
    """Each metric a query names, with the labels its selector matches on."""
    return [(name, set(_MATCHER.findall(selector or ""))) for name, selector in _METRIC.findall(expr)]


def grouping_labels(expr: str) -> set[str]:
    """Labels a query aggregates by (`by (...)`, `without (...)`)."""
    return {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label.strip()}
