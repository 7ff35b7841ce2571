"""What KubeRay v1.7.0 derives from a RayService: the serve Service it creates and the labels of the pods it makes.

Facts from ray-operator/controllers/ray/common/service.go BuildServeService and common/pod.go BuildPod (v1.7.0).
"""
import copy
from typing import Any

from tests.helm.kuberay_pod import HEAD_GROUP, pod_labels

INCREMENTAL = "NewClusterWithIncrementalUpgrade"
# KubeRay names each RayCluster of a RayService <RayService name>-<random suffix>.
CLUSTER_SUFFIX = "x7k2p"


def cluster_name(service: dict[str, Any]) -> str:
    return f"{service['metadata']['name']}-{CLUSTER_SUFFIX}"


def is_incremental(service: dict[str, Any]) -> bool:
    return service["spec"].get("upgradeStrategy", {}).get("type") == INCREMENTAL


def head_container(service: dict[str, Any]) -> dict[str, Any]:
    return service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]


def serve_service(service: dict[str, Any], cluster: str | None = None) -> dict[str, Any]:
    """The Service KubeRay creates for HTTP traffic to the Serve proxies of `cluster` (its RayCluster's name)."""
    cluster = cluster or cluster_name(service)
    # With the incremental upgrade every cluster gets its own Service, named after the cluster, behind the Gateway.
    owner = cluster if is_incremental(service) else service["metadata"]["name"]
    labels = {
        "ray.io/originated-from-cr-name": owner,
        "ray.io/originated-from-crd": "RayService",
        "ray.io/serve": f"{owner}-serve",
    }
    selector = {"ray.io/cluster": cluster, "ray.io/serve": "true"}
    ports = [
        {"name": p["name"], "port": p["containerPort"]}
        for p in head_container(service).get("ports", [])
        if p.get("name") == "serve" or p.get("name", "").startswith("serve-")
    ]
    custom = service["spec"].get("serveService")
    if custom is None or is_incremental(service):
        metadata = {"name": f"{owner}-serve-svc", "labels": labels}
        spec = {"selector": selector, "ports": ports}
        return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}
    made = {"apiVersion": "v1", "kind": "Service", **copy.deepcopy(custom)}
    made["spec"]["selector"] = selector  # the user's selector is always replaced
    # A user port named like a detected serving port replaces it; the others are dropped.
    by_name = {p["name"]: p for p in made["spec"].get("ports", [])}
    if ports:
        made["spec"]["ports"] = [by_name.get(p["name"], p) for p in ports]
    made["metadata"].setdefault("labels", {}).update(labels)
    made["metadata"].setdefault("name", f"{owner}-serve-svc")
    return made


def pods(service: dict[str, Any]) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """(kind, labels, Ray container) of the head pod and one pod of each worker group, proxies healthy."""
    cluster_spec = service["spec"]["rayClusterConfig"]
    cluster, serving = cluster_name(service), {"ray.io/serve": "true"}
    head = cluster_spec["headGroupSpec"]["template"]
    found = [("head", {**pod_labels(head["metadata"]["labels"], cluster, True, HEAD_GROUP), **serving},
              head["spec"]["containers"][0])]
    for group in cluster_spec.get("workerGroupSpecs", []):
        template = group["template"]
        labels = {**pod_labels(template["metadata"]["labels"], cluster, False, group["groupName"]), **serving}
        found.append(("worker", labels, template["spec"]["containers"][0]))
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels) picks an object with `labels`."""
    return all(labels.get(key) == value for key, value in selector.items())


def container_port(container: dict[str, Any], target: int | str) -> int | None:
    """The container port a Service's targetPort (a number or a port name) reaches, None if none."""
    if isinstance(target, int):
        return target
    return next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == target), None)
