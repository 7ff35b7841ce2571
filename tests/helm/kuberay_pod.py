"""What KubeRay v1.7.0 adds to a RayService's pod templates before Kubernetes runs them, as plain functions.

Each function follows one function of KubeRay v1.7.0's `ray-operator/controllers/ray/common/pod.go` (named in
its docstring), so the replay test runs a pod the way the operator would build it from the rendered chart.
"""
import copy
import re
from typing import Any

# ray-operator/controllers/ray/utils/constant.go (v1.7.0)
DEFAULT_GCS_PORT = 6379
DEFAULT_METRICS_PORT = 8080
DEFAULT_DASHBOARD_PORT = 8265
DEFAULT_AGENT_PORT = 52365
DEFAULT_SERVING_PORT = 8000
HEAD_GROUP = "headgroup"
WGET = "wget --tries 1 -T {timeout_s} -q -O- http://localhost:{port}/{path} | grep success"
_BOOLEAN_VALUED = {"log-color", "include-dashboard", "include-log-monitor"}
_QUANTITY = re.compile(r"^([0-9.]+)(m|Ki|Mi|Gi|Ti|K|M|G|T)?$")
_UNITS = {None: 1, "m": 0.001, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity ("500m", "8Gi", 2) as a number."""
    found = _QUANTITY.match(str(text))
    if found is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return float(found.group(1)) * _UNITS[found.group(2)]


def head_port(head_params: dict[str, str]) -> int:
    """GetHeadPort: the GCS port of the head's rayStartParams, 6379 by default."""
    return int(head_params.get("port", DEFAULT_GCS_PORT))


def complete_params(params: dict[str, str], head: bool, gcs_address: str, autoscaling: bool) -> dict[str, str]:
    """setMissingRayStartParams (and the head template's `no-monitor` when in-tree autoscaling is on)."""
    done = dict(params)
    if head:
        done.setdefault("dashboard-host", "0.0.0.0")
        if autoscaling:
            done["no-monitor"] = "true"
    else:
        done.setdefault("address", gcs_address)
    done.setdefault("metrics-export-port", str(DEFAULT_METRICS_PORT))
    done["block"] = "true"
    done.setdefault("dashboard-agent-listen-port", str(DEFAULT_AGENT_PORT))
    return done


def with_resources(params: dict[str, str], container: dict[str, Any]) -> dict[str, str]:
    """generateRayStartCommand's resource defaults: num-cpus, memory and num-gpus from the container's limits."""
    done = dict(params)
    resources = container.get("resources", {})
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    cpu = limits.get("cpu") or requests.get("cpu")
    if "num-cpus" not in done and cpu is not None and quantity(cpu) > 0:
        done["num-cpus"] = str(int(quantity(cpu)))
    if "memory" not in done and "memory" in limits:
        done["memory"] = str(int(quantity(limits["memory"])))
    if "num-gpus" not in done and "nvidia.com/gpu" in limits:
        done["num-gpus"] = str(int(quantity(limits["nvidia.com/gpu"])))
    return done


def ray_start_command(params: dict[str, str], head: bool) -> str:
    """generateRayStartCommand with convertParamMap: sorted flags, "true" as a bare flag, "false" dropped."""
    flags = []
    for option in sorted(params):
        value = params[option]
        if value.lower() in ("true", "false") and option not in _BOOLEAN_VALUED:
            if value.lower() == "true":
                flags.append(f" --{option} ")
        else:
            flags.append(f" --{option}={value} ")
    return ("ray start --head " if head else "ray start ") + "".join(flags)


def container_args(start_command: str) -> list[str]:
    """BuildPod: the Ray container runs `/bin/bash -c -- "ulimit -n ...; <ray start>"` (GetContainerCommand)."""
    return ["/bin/bash", "-c", "--", f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {start_command}"]


def pod_labels(template_labels: dict[str, str], cluster: str, head: bool, group: str) -> dict[str, str]:
    """labelPod, then BuildPod's `ray.io/serve` (false on a RayService head until the controller says it serves)."""
    labels = {
        "ray.io/is-ray-node": "yes", "ray.io/cluster": cluster, "ray.io/node-type": "head" if head else "worker",
        "ray.io/group": group, "ray.io/identifier": f"{cluster}-{'head' if head else 'worker'}",
        "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator",
    }
    fixed = {"ray.io/node-type", "ray.io/group", "ray.io/cluster"}
    labels.update({k: v for k, v in template_labels.items() if k not in fixed})
    labels["ray.io/serve"] = "false" if head else "true"
    return labels


def injected_env(container: dict[str, Any], head: bool, gcs_address: str, port: int, start_command: str,
                 auth_secret: str | None, autoscaling: bool) -> list[dict[str, Any]]:
    """setContainerEnvVars for a RayService pod, SetContainerTokenAuthEnvVars and setAutoscalerV1EnvVars."""
    env = copy.deepcopy(container.get("env", []))
    names = {e["name"] for e in env}

    def add(name: str, value: str | None = None, field: str | None = None, unless_set: bool = False) -> None:
        if unless_set and name in names:
            return
        entry: dict[str, Any] = {"name": name}
        if field is None:
            entry["value"] = value
        else:
            entry["valueFrom"] = {"fieldRef": {"fieldPath": field}}
        env.append(entry)
        names.add(name)

    if head and autoscaling:
        add("RAY_ENABLE_AUTOSCALER_V2", "false")
    ip = "127.0.0.1" if head else gcs_address.rsplit(":", 1)[0]
    if not head:
        add("FQ_RAY_IP", ip)
        add("RAY_IP", ip.split(".", 1)[0])
    add("RAY_CLUSTER_NAME", field="metadata.labels['ray.io/cluster']")
    add("RAY_CLUSTER_NAMESPACE", field="metadata.namespace")
    add("RAY_CLOUD_INSTANCE_ID", field="metadata.name")
    add("RAY_NODE_TYPE_NAME", field="metadata.labels['ray.io/group']")
    add("KUBERAY_GEN_RAY_START_CMD", start_command)
    add("RAY_PORT", str(port), unless_set=True)
    add("RAY_TIMEOUT_MS_TASK_WAIT_FOR_DEATH_INFO", "0", unless_set=True)
    add("RAY_GCS_SERVER_REQUEST_TIMEOUT_SECONDS", "5", unless_set=True)
    add("RAY_SERVE_KV_TIMEOUT_S", "5", unless_set=True)
    add("RAY_ADDRESS", f"{ip}:{port}", unless_set=True)
    add("RAY_USAGE_STATS_KUBERAY_IN_USE", "1", unless_set=True)
    if head:
        add("RAY_USAGE_STATS_EXTRA_TAGS", "kuberay_version=v1.7.0;kuberay_crd=RayService")
    add("RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "1", unless_set=True)
    if auth_secret is not None:
        add("RAY_AUTH_MODE", "token", unless_set=True)
        if "RAY_AUTH_TOKEN" not in names:
            env.append({"name": "RAY_AUTH_TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": auth_secret, "key": "auth_token"}}})
    return env


def _port_of(container: dict[str, Any], name: str, default: int) -> int:
    """FindContainerPort: the containerPort named `name`, else `default`."""
    for port in container.get("ports", []):
        if port.get("name") == name:
            return int(port["containerPort"])
    return default


def injected_probes(container: dict[str, Any], params: dict[str, str], head: bool) -> dict[str, Any]:
    """initLivenessAndReadinessProbe for Ray >= 2.53 in a RayService: probes the container sets are kept."""
    done = copy.deepcopy(container)
    agent_port = int(params.get("dashboard-agent-listen-port", DEFAULT_AGENT_PORT))
    health = {"path": "/api/healthz", "port": agent_port}
    if "livenessProbe" not in done:
        done["livenessProbe"] = {"initialDelaySeconds": 30, "timeoutSeconds": 5 if head else 2, "periodSeconds": 5,
                                 "successThreshold": 1, "failureThreshold": 120, "httpGet": dict(health)}
    if "readinessProbe" not in done:
        probe: dict[str, Any] = {"initialDelaySeconds": 10, "timeoutSeconds": 5 if head else 2, "periodSeconds": 5,
                                 "successThreshold": 1, "failureThreshold": 10, "httpGet": dict(health)}
        if not head:  # a serving worker is ready only when its own Serve proxy is (kuberay#1808 keeps the head out)
            raylet = WGET.format(timeout_s=2, port=agent_port, path="api/local_raylet_healthz")
            proxy = WGET.format(timeout_s=10, port=_port_of(done, "serve", DEFAULT_SERVING_PORT), path="-/healthz")
            probe.pop("httpGet")
            probe["failureThreshold"] = 1
            probe["exec"] = {"command": ["bash", "-c", f"{raylet} && {proxy}"]}
        done["readinessProbe"] = probe
    return done


def wait_gcs_command(gcs_address: str) -> list[str]:
    """The worker's injected `wait-gcs-ready` init container: poll `ray health-check` until the GCS answers."""
    loop = (f"until ray health-check --address {gcs_address} > /dev/null 2>&1; do "
            "echo waiting for GCS; sleep 1; done")
    return ["/bin/bash", "-c", "--", loop]
