"""The ingress's Prometheus metrics fed from finished requests: plans counted, the planner's error observed."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.metrics import ServeMetrics
from workers.worker import Finished


def _finished(plan: str, ttft_s: float, predicted_ttft_s: float | None) -> Finished:
    return Finished("stop", 100, 4, ttft_s, "cacheblend", 0.15, {"ram": 80}, 20, "w0", plan, predicted_ttft_s)


def test_plans_are_counted_and_prediction_error_is_measured_over_predicted() -> None:
    metrics = ServeMetrics()
    metrics.observe(_finished("blend", 0.3, 0.2))  # 1.5x the prediction
    metrics.observe(_finished("plain", 0.5, 0.5))
    metrics.observe(_finished("blend", 0.4, None))  # not planned: counted, no error observed
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    assert samples[("blendserve_plans_total", (("plan", "blend"),))] == 2
    assert samples[("blendserve_plans_total", (("plan", "plain"),))] == 1
    assert samples[("blendserve_ttft_prediction_error_count", (("plan", "blend"),))] == 1
    assert samples[("blendserve_ttft_prediction_error_sum", (("plan", "blend"),))] == pytest.approx(1.5)
    assert samples[("blendserve_ttft_prediction_error_bucket", (("le", "1.25"), ("plan", "blend")))] == 0
    assert samples[("blendserve_ttft_prediction_error_bucket", (("le", "1.5"), ("plan", "blend")))] == 1
