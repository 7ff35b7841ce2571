"""The chart serves when started the way KubeRay v1.7.0 starts it: pods as sandboxes on a real Ray, in its order.

Rendered with Helm for a CPU-only values file; the head and a worker pod each get their own network namespace
(own loopback and ports, so one pod's probe never reaches the other's proxy), mount namespace (the rendered
volumes, fresh claims root-owned 0755 as a new PVC is), /tmp and user (the image's uid/gid unless the pod says
otherwise), with the environment and probes KubeRay injects. What only a real cluster proves (Kubernetes
scheduling, the Ray autoscaler's pods, image pulls) is listed in docs/deploy.md.
"""
import base64
import copy
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import httpx
import pytest
import yaml

from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options
from tests.helm.kuberay_replay import RayServiceReplay, replica_ids
from tests.helm.kuberay_services import serve_service
from tests.helm.pod_network import PodNetwork
from tests.helm.pod_sandbox import Image, Pod
from tests.helm.rendering import manifests, of_kind, one
from workers.model.default import prepare_default_model

VALUES = Path(__file__).with_name("replay_values.yaml")
MODEL_BUCKET = "models"
DOCUMENTS = [{"text": "The Eiffel Tower is a lattice tower in Paris, France."},
             {"text": "Mount Fuji is the highest mountain in Japan, at 3,776 metres."}]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pods need network and mount namespaces (root)")


def _secrets(objects: list[dict[str, Any]]) -> dict[str, dict[str, bytes]]:
    return {s["metadata"]["name"]: {k: base64.b64decode(v) for k, v in s.get("data", {}).items()}
            for s in of_kind(objects, "Secret")}


def _api_key(objects: list[dict[str, Any]]) -> str:
    """The key the chart generated: the first of the {key: tenant} mapping in its Secret."""
    (keys,) = [yaml.safe_load(data) for s in _secrets(objects).values() for data in s.values()]
    return next(iter(keys))


def _services(objects: list[dict[str, Any]], service: dict[str, Any], cluster: str) -> list[dict[str, Any]]:
    """The chart's Services and the serve Service KubeRay makes for `cluster` (BuildServeService)."""
    return of_kind(objects, "Service") + [serve_service(service, cluster)]


def image_uid(pod: Pod) -> int:
    return pod.user(pod.container)[0]


def _chat(pod: Pod, key: str | None, question: str) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    body = {"messages": [{"role": "user", "content": question}], "documents": DOCUMENTS, "max_tokens": 8}
    return httpx.post(f"http://{pod.ip}:{pod.port('serve')}/v1/chat/completions", json=body, headers=headers,
                      timeout=120)


def _scrape_once(replay: RayServiceReplay, objects: list[dict[str, Any]], service: dict[str, Any]) -> str:
    """What the ServiceMonitor's one scrape gets: every pod its Services select is a target, one must remain."""
    monitor = one(objects, "ServiceMonitor")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    selected = [s for s in _services(objects, service, replay.cluster_name)
                if all(s["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
    (endpoint,) = monitor["spec"]["endpoints"]
    targets = []
    for svc in selected:
        (port,) = [p for p in svc["spec"]["ports"] if p.get("name") == endpoint["port"]]
        targets += [(pod, pod.port(port.get("targetPort", port["port"]))) for pod in
                    replay.pods_matching(svc["spec"]["selector"])]
    assert len(targets) == 1, f"the ServiceMonitor scrapes {len(targets)} targets: {[p.name for p, _ in targets]}"
    (pod, port), = targets
    answer = httpx.get(f"http://{pod.ip}:{port}{endpoint.get('path', '/metrics')}", timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.text


def _wait_for_config(replay: RayServiceReplay, deployment: str, check: Any, timeout_s: float) -> dict[str, Any]:
    """The applications once `check(deployment_config)` holds and every application runs again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        applications = replay.wait_running(timeout_s)
        configs = [app["deployments"][deployment]["deployment_config"] for app in applications.values()
                   if deployment in app["deployments"]]
        if configs and all(check(c) for c in configs):
            return applications
        time.sleep(1.0)
    raise AssertionError(f"{deployment}'s config never took the new value: {configs}")


@pytest.fixture
def pod_root() -> Iterator[Path]:
    """A short folder for the pods (Ray's socket paths live under each pod's /tmp, mapped here)."""
    root = Path(tempfile.mkdtemp(prefix="bsr", dir="/tmp"))
    yield root
    os.system(f"rm -rf {root}")


@pytest.mark.slow  # make test's budget (~2 min on AVX2); test_upgrades runs the rendered app on a real Ray
def test_the_chart_serves_when_kuberay_starts_it(pod_root: Path):
    values = yaml.safe_load(VALUES.read_text())
    image = Image(Path(sys.executable).parent, Path(sys.base_prefix))
    with PodNetwork() as network, LocalS3(host=network.gateway) as endpoint_url:
        # The checkpoint in the object store the pods' init containers fetch it from, through the node's address.
        create_bucket(endpoint_url, MODEL_BUCKET)
        store = fsspec.filesystem("s3", **s3_storage_options(endpoint_url))
        store.put(f"{prepare_default_model()}/", values["model"]["fetch"]["url"], recursive=True)
        values["model"]["fetch"]["endpointUrl"] = endpoint_url
        objects = manifests(values)
        service = one(objects, "RayService")
        # What the user creates with kubectl before installing: the object store's credentials.
        credentials = {"AWS_ACCESS_KEY_ID": b"testing", "AWS_SECRET_ACCESS_KEY": b"testing"}
        secrets = {**_secrets(objects), values["model"]["fetch"]["credentials"]["existingSecret"]: credentials}
        replay = RayServiceReplay(service, secrets, {}, image, pod_root, network)
        try:
            _replay(replay, values, objects, service)
        except (AssertionError, OSError) as failure:  # what the pods said goes with the failure
            logs = "\n".join(f"--- {pod.name} {log.stem}:\n{pod.log_tail(log.stem)}" for pod in replay.pods
                             for log in sorted(pod.log_dir.glob("*.log")))
            raise AssertionError(f"{failure}\n{logs}") from None
        finally:
            replay.stop()


def _replay(replay: RayServiceReplay, values: dict[str, Any], objects: list[dict[str, Any]],
            service: dict[str, Any]) -> None:
    replay.start_head()
    (group,) = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    worker = replay.start_worker(group)
    # KubeRay submits serveConfigV2 only once the head pod is Ready.
    replay.wait_head_ready(timeout_s=120)
    replay.submit(service["spec"]["serveConfigV2"])
    before = replay.wait_running(timeout_s=300)
    worker.wait_probe("readinessProbe", timeout_s=120)

    key = _api_key(objects)
    assert _chat(worker, None, "Which city hosts the Eiffel Tower?").status_code == 401
    answer = _chat(worker, key, "Which city hosts the Eiffel Tower?")
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]

    # The worker's node shard claimed its SSD slot, named by the node, on the fresh claim as the image's user.
    ssd_root = worker.volumes.folders["data"] / "kv"
    assert (ssd_root / f".{replay.node_name}.lock").stat().st_uid == image_uid(worker), sorted(ssd_root.iterdir())

    metrics = _scrape_once(replay, objects, service)
    assert 'blendserve_requests_total{endpoint="chat",status="200"} 1.0' in metrics, metrics[:3000]

    changed = copy.deepcopy(values)
    changed["autoscaling"]["policy"]["target_queue_per_replica"] = 6.0
    upgraded = one(manifests(changed), "RayService")
    # A new cluster only when rayClusterConfig changes; a new serveConfigV2 is submitted to the running one.
    assert upgraded["spec"]["rayClusterConfig"] == service["spec"]["rayClusterConfig"]
    assert upgraded["spec"]["serveConfigV2"] != service["spec"]["serveConfigV2"]
    replay.submit(upgraded["spec"]["serveConfigV2"])
    after = _wait_for_config(replay, "WorkerDeployment",
                             lambda c: "6.0" in repr(c.get("autoscaling_config")), timeout_s=120)
    assert replica_ids(after) == replica_ids(before), "a replica restarted for an autoscaling change"
    assert _chat(worker, key, "How high is Mount Fuji?").status_code == 200
    for pod in replay.pods:  # no container the kubelet would restart
        passed, seen = pod.probe(pod.container["livenessProbe"])
        assert passed, f"{pod.name}: livenessProbe fails: {seen}"

    # `helm test`: the hook pod calls the serve Service by name, which cluster DNS resolves to the serving pods.
    serve_name = serve_service(service, replay.cluster_name)["metadata"]["name"]
    hosts = {serve_name: worker.ip, f"{serve_name}.{replay.namespace}.svc.cluster.local": worker.ip}
    (hook,) = [p for p in of_kind(objects, "Pod") if p["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    code, output = replay.run_pod(hook, hosts, timeout_s=300)
    assert code == 0, f"helm test failed ({code}):\n{output}"
