"""A rendered RayService started on this machine in KubeRay v1.7.0's order, its pods as sandboxes on a real Ray.

KubeRay's RayService controller (rayservice_controller.go reconcileServe) creates the RayCluster, waits for the
head pod to be running and Ready, and only then PUTs `serveConfigV2` (as JSON) to the dashboard's
`/api/serve/applications/`; it submits again whenever that text changes. Worker pods wait for the GCS in an
injected init container. This module does the same with the pods the chart renders, completed by the functions
of `tests.helm.kuberay_pod`.
"""
import copy
import json
import secrets
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.helm import kuberay_pod as kuberay
from tests.helm.kuberay_services import selects
from tests.helm.pod_network import PodNetwork
from tests.helm.pod_sandbox import Image, Pod, PodVolumes


@dataclass(slots=True)
class RayServiceReplay:
    """The pods of one RayService's Ray cluster, started from the rendered object on one machine."""

    service: dict[str, Any]
    secrets: dict[str, dict[str, bytes]]
    claims: dict[str, Path]
    image: Image
    root: Path
    network: PodNetwork
    namespace: str = "ai"
    node_name: str = "node-a"
    pods: list[Pod] = field(default_factory=list)
    cluster_name: str = ""
    auth_token: str = ""

    def __post_init__(self) -> None:
        self.cluster_name = f"{self.service['metadata']['name']}-{secrets.token_hex(3)[:5]}"
        if self._cluster.get("authOptions", {}).get("mode") == "token":
            # KubeRay creates this Secret (named after the cluster) with a random token for every Ray container.
            self.auth_token = secrets.token_urlsafe(32)
            self.secrets[self.cluster_name] = {"auth_token": self.auth_token.encode()}

    @property
    def _cluster(self) -> dict[str, Any]:
        return self.service["spec"]["rayClusterConfig"]

    @property
    def head(self) -> Pod:
        return self.pods[0]

    def _pod(self, group: dict[str, Any], head: bool, gcs_address: str) -> tuple[Pod, list[str]]:
        """DefaultHeadPodTemplate / DefaultWorkerPodTemplate, then BuildPod: the pod and its Ray command."""
        template = copy.deepcopy(group["template"])
        spec, container = template["spec"], template["spec"]["containers"][0]
        autoscaling = bool(self._cluster.get("enableInTreeAutoscaling"))
        params = kuberay.complete_params({k: str(v) for k, v in group.get("rayStartParams", {}).items()},
                                         head, gcs_address, autoscaling)
        params = kuberay.with_resources(params, container)
        command = kuberay.ray_start_command(params, head)
        port = kuberay.head_port(self._cluster["headGroupSpec"].get("rayStartParams", {}))
        token_secret = self.cluster_name if self.auth_token else None
        container["env"] = kuberay.injected_env(container, head, gcs_address, port, command, token_secret,
                                                autoscaling)
        volume_names = {v["name"] for v in spec.get("volumes", [])}
        mounts = container.setdefault("volumeMounts", [])
        if "plasma-directory" not in params and not any(m["mountPath"] == "/dev/shm" for m in mounts):
            spec.setdefault("volumes", []).append({"name": "shared-mem", "emptyDir": {"medium": "Memory"}})
            mounts.append({"name": "shared-mem", "mountPath": "/dev/shm"})
        if head and autoscaling and "ray-logs" not in volume_names:  # shared with the autoscaler sidecar
            spec.setdefault("volumes", []).append({"name": "ray-logs", "emptyDir": {}})
            mounts.append({"name": "ray-logs", "mountPath": "/tmp/ray"})
        container = kuberay.injected_probes(container, params, head)
        group_name = kuberay.HEAD_GROUP if head else group["groupName"]
        labels = kuberay.pod_labels(template.get("metadata", {}).get("labels", {}), self.cluster_name, head,
                                    group_name)
        name = f"{self.cluster_name}-{'head' if head else group_name + '-worker'}-{len(self.pods)}"
        pod_root = self.root / name
        volumes = PodVolumes(pod_root, self.secrets, self.claims, spec.get("securityContext", {}).get("fsGroup"))
        pod = Pod(name, spec, container, labels, self.namespace, self.node_name, self.image, self.network, volumes)
        self.pods.append(pod)
        return pod, kuberay.container_args(command)

    def start_head(self, init_timeout_s: float = 300.0) -> Pod:
        pod, argv = self._pod(self._cluster["headGroupSpec"], True, "")
        pod.run_init_containers([], init_timeout_s)
        pod.start(pod.container, argv, "ray-head")
        return pod

    def start_worker(self, group: dict[str, Any], init_timeout_s: float = 300.0) -> Pod:
        port = kuberay.head_port(self._cluster["headGroupSpec"].get("rayStartParams", {}))
        gcs = f"{self.head.ip}:{port}"
        pod, argv = self._pod(group, False, gcs)
        wait_gcs = {"name": "wait-gcs-ready", "env": pod.container["env"],
                    "securityContext": pod.container.get("securityContext", {})}
        pod.run_init_containers([(wait_gcs, kuberay.wait_gcs_command(gcs))], init_timeout_s)
        pod.start(pod.container, argv, "ray-worker")
        return pod

    def run_pod(self, manifest: dict[str, Any], hosts: dict[str, str], timeout_s: float) -> tuple[int, str]:
        """A plain pod of the chart (a `helm test` hook) run to completion: (exit code, its output)."""
        spec = copy.deepcopy(manifest["spec"])
        (container,) = spec["containers"]
        name = manifest["metadata"]["name"]
        fs_group = spec.get("securityContext", {}).get("fsGroup")
        volumes = PodVolumes(self.root / name, self.secrets, self.claims, fs_group)
        pod = Pod(name, spec, container, manifest["metadata"].get("labels", {}), self.namespace, self.node_name,
                  self.image, self.network, volumes, hosts=hosts)
        self.pods.append(pod)
        process = pod.start(container, container.get("command", []) + container.get("args", []), name)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = -1
        return code, pod.log_tail(name)

    def wait_head_ready(self, timeout_s: float) -> None:
        """The kubelet's startup probe (if any), then readiness: what the controller waits for before submitting."""
        deadline = time.monotonic() + timeout_s
        self.head.wait_probe("startupProbe", timeout_s)
        self.head.wait_probe("readinessProbe", max(1.0, deadline - time.monotonic()))

    def _dashboard(self, method: str, body: bytes | None = None) -> Any:
        port = self.head.port("dashboard")
        request = urllib.request.Request(f"http://{self.head.ip}:{port}/api/serve/applications/", data=body,
                                         method=method, headers={"Content-Type": "application/json"})
        if self.auth_token:
            request.add_header("x-ray-authorization", f"Bearer {self.auth_token}")  # as KubeRay's client sends it
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
        return json.loads(text) if text else None

    def submit(self, serve_config_v2: str) -> None:
        """updateServeDeployment: serveConfigV2's YAML as JSON, PUT to the head's dashboard."""
        self._dashboard("PUT", json.dumps(yaml.safe_load(serve_config_v2)).encode())

    def applications(self) -> dict[str, Any]:
        """The dashboard's serve details (what the controller reads back): application name -> details."""
        return self._dashboard("GET")["applications"]

    def wait_running(self, timeout_s: float) -> dict[str, Any]:
        deadline, seen = time.monotonic() + timeout_s, {}
        while time.monotonic() < deadline:
            seen = self.applications()
            if seen and all(app["status"] == "RUNNING" for app in seen.values()):
                return seen
            if any(app["status"] in ("DEPLOY_FAILED", "UNHEALTHY") for app in seen.values()):
                break
            time.sleep(1.0)
        statuses = {name: (app["status"], app.get("message", "")[-2000:]) for name, app in seen.items()}
        raise AssertionError(f"serve applications not RUNNING: {statuses}")

    def pods_matching(self, selector: dict[str, str]) -> list[Pod]:
        """The pods a Service's label selector picks."""
        return [pod for pod in self.pods if selects(selector, pod.labels)]

    def stop(self) -> None:
        for pod in reversed(self.pods):
            pod.stop()


def replica_ids(applications: dict[str, Any]) -> dict[str, set[tuple[str, int]]]:
    """Deployment name -> its running replicas as (replica id, pid)."""
    found: dict[str, set[tuple[str, int]]] = {}
    for app in applications.values():
        for name, deployment in app["deployments"].items():
            found[name] = {(r["replica_id"], r["pid"]) for r in deployment["replicas"] if r["state"] == "RUNNING"}
    return found
