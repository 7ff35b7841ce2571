"""Every query of the chart's Grafana dashboard names metrics and labels that the live /metrics exports.

Collected by test_serving.py (imported at its end), so it scrapes that module's running app after its traffic.
"""
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.helm.rendering import dashboard, dashboard_queries, grouping_labels, manifests, metric_references

DOCS = ["Lake Baikal in Siberia is the deepest lake on Earth.", "The Nile flows north into the Mediterranean Sea."]
# Sample names a family of each type exports (prometheus_client's exposition).
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
SHADOW_TIMEOUT_S = 60.0


def _chat(server: str) -> None:
    body = {"messages": [{"role": "user", "content": "Which lake is the deepest?"}], "max_tokens": 4,
            "documents": [{"text": text} for text in DOCS]}
    response = httpx.post(f"{server}/v1/chat/completions", json=body, headers={"X-Tenant": "dashboard"}, timeout=120)
    assert response.status_code == 200, response.text


def _exported(server: str) -> dict[str, set[str]]:
    """Sample name -> label names seen on it, in one scrape."""
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(httpx.get(f"{server}/metrics", timeout=30).text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            exported.setdefault(family.name + suffix, set())
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


def test_every_dashboard_query_names_an_exported_metric(server: str) -> None:
    _chat(server)
    _chat(server)  # reuses the first request's chunks: reuse per tier, and a blended request for the shadow
    deadline_s = time.monotonic() + SHADOW_TIMEOUT_S
    while not _exported(server)["blendserve_shadow"] and time.monotonic() < deadline_s:
        time.sleep(0.5)
    exported = _exported(server)
    queries = dashboard_queries(dashboard(manifests()))
    assert len(queries) >= 15
    for expr in queries:
        references = metric_references(expr)
        for name, labels in references:
            assert name in exported, f"{name} (in {expr!r}) is not in /metrics"
            assert labels <= exported[name], f"{expr!r} selects on {labels - exported[name]}, not labels of {name}"
        available = set().union(*(exported[name] for name, _ in references))
        assert grouping_labels(expr) <= available, f"{expr!r} groups by labels its metrics do not have"
