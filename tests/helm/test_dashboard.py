"""The Grafana dashboard ships in a ConfigMap for Grafana's sidecar and charts every figure operators need."""
import json

from tests.helm.rendering import CHART_DIR, dashboard, dashboard_queries, manifests, metric_references, of_kind


def test_the_dashboard_configmap_is_labelled_for_the_grafana_sidecar():
    objects = manifests()
    (config_map,) = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"] == "rag-blendserve-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard(objects) == json.loads((CHART_DIR / "dashboards" / "blendserve.json").read_text())


def test_every_panel_queries_blendserve_metrics_through_the_datasource_variable():
    board = dashboard(manifests())
    variable = board["templating"]["list"][0]
    assert variable == {**variable, "name": "datasource", "type": "datasource"}
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert metric_references(target["expr"]), target["expr"]


def test_the_dashboard_charts_latency_traffic_reuse_load_scaling_and_guardrails():
    queries = "\n".join(dashboard_queries(dashboard(manifests())))
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}, sum by (le) (rate(blendserve_ttft_seconds_bucket" in queries
    for needed in (
        "sum by (endpoint, status) (rate(blendserve_requests_total",  # requests by status
        'blendserve_requests_total{status!="200"}',  # errors
        "sum by (tier) (rate(blendserve_reused_tokens_total",  # tokens reused per tier
        "blendserve_recompute_ratio_bucket",  # recompute ratio
        "blendserve_queue_depth",
        'blendserve_requests_total{status="429"}',
        "blendserve_kv_evictions",
        "blendserve_workers_ready",
        "blendserve_blending_refused",
        'blendserve_shadow{figure="top1_agreement"}',
    ):
        assert needed in queries, needed
