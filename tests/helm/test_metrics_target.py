"""Prometheus scrapes blendserve's /metrics once per Ray cluster: on the head pod, never through every Serve proxy.

Every Serve proxy forwards /metrics to the one ingress replica, so a target per ready pod reads the same counters
N times and the dashboard's sum(rate(...)) panels N times too high.
"""
import pytest

from tests.helm.kuberay_services import container_port, pods, selects, serve_service
from tests.helm.rendering import manifests, of_kind, one, serve_config

MONITORED = {
    "metrics": {"serviceMonitor": {"enabled": True}},
    "apiKeys": {"metricsRequireKey": False},
}
INCREMENTAL = {
    **MONITORED,
    "helmTest": {"enabled": False},  # it needs the Gateway's address under this strategy
    "upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
        "gatewayClassName": "istio", "stepSizePercent": 25, "intervalSeconds": 60}},
}
TWO_GROUPS = {
    **MONITORED,
    "workerGroups": [
        {"name": "a100", "replicas": 1, "minReplicas": 1, "maxReplicas": 2, "gpus": 2, "cpus": 16,
         "memory": "128Gi", "shmSize": "16Gi"},
        {"name": "l4", "replicas": 2, "minReplicas": 0, "maxReplicas": 4, "gpus": 1, "cpus": 8,
         "memory": "32Gi", "shmSize": "8Gi"},
    ],
}


@pytest.mark.parametrize("values", [MONITORED, INCREMENTAL, TWO_GROUPS], ids=["new-cluster", "incremental", "groups"])
def test_the_service_monitor_scrapes_the_head_pod_alone(values):
    objects = manifests(values)
    service = one(objects, "RayService")
    monitor = one(objects, "ServiceMonitor")
    # Every Service the cluster will have: the chart's own and the serve Service KubeRay creates.
    services = of_kind(objects, "Service") + [serve_service(service)]
    chosen = [s for s in services if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert len(chosen) == 1, [s["metadata"]["name"] for s in chosen]
    (target,) = chosen
    picked = [kind for kind, labels, _ in pods(service) if selects(target["spec"]["selector"], labels)]
    assert picked == ["head"], "one pod per cluster: the head, whose proxy always runs"
    assert target["metadata"]["name"] == "rag-blendserve-metrics"  # the chart's own: stable under any upgrade


@pytest.mark.parametrize("values", [MONITORED, INCREMENTAL], ids=["new-cluster", "incremental"])
def test_the_scraped_port_is_the_heads_serve_proxy(values):
    objects = manifests(values)
    service = one(objects, "RayService")
    monitor = one(objects, "ServiceMonitor")
    target = next(s for s in of_kind(objects, "Service")
                  if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"]))
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    (port,) = [p for p in target["spec"]["ports"] if p["name"] == endpoint["port"]]
    head = next(container for kind, _, container in pods(service) if kind == "head")
    # The head's Serve proxy listens where serveConfigV2's http_options say.
    assert container_port(head, port.get("targetPort", port["port"])) == serve_config(objects)["http_options"]["port"]


def test_a_head_that_is_not_ready_is_still_scraped():
    """/readyz fails while no worker has its model: exactly when the ingress's figures matter most."""
    objects = manifests(MONITORED)
    monitor = one(objects, "ServiceMonitor")
    target = next(s for s in of_kind(objects, "Service")
                  if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"]))
    assert target["spec"]["publishNotReadyAddresses"] is True


def test_the_metrics_key_still_goes_with_the_scrape():
    values = {"metrics": {"serviceMonitor": {"enabled": True, "bearerTokenSecret": {"name": "prom", "key": "token"}}},
              "apiKeys": {"metricsRequireKey": True}}
    (endpoint,) = one(manifests(values), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "prom", "key": "token"}}


def test_no_metrics_service_without_the_service_monitor():
    assert [s for s in of_kind(manifests(), "Service") if s["metadata"]["name"] == "rag-blendserve-metrics"] == []
