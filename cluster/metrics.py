"""The Prometheus metrics `GET /metrics` serves, kept in the ingress's own registry."""
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from scheduler.membership import WorkerReport
from workers.worker import Finished

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)
PREDICTION_ERROR_BUCKETS = (0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)  # measured / predicted


class ServeMetrics:
    """Counters and histograms fed per request; gauges set from the cluster's state at each scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "blendserve_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.ttft = Histogram(
            "blendserve_ttft_seconds", "Time to first token", ["mode"], buckets=TTFT_BUCKETS_S, registry=r
        )
        self.reused_tokens = Counter(
            "blendserve_reused_tokens", "Prompt tokens served from cached KV, by tier", ["tier"], registry=r
        )
        self.recomputed_tokens = Counter(
            "blendserve_recomputed_tokens", "Prompt tokens whose KV was computed", registry=r
        )
        self.recompute_ratio = Histogram(
            "blendserve_recompute_ratio", "Recompute ratio used per request", buckets=RATIO_BUCKETS, registry=r
        )
        self.plans = Counter(
            "blendserve_plans", "Requests by the plan that ran: blend or plain (whole prompt)", ["plan"], registry=r
        )
        self.ttft_prediction_error = Histogram(
            "blendserve_ttft_prediction_error",
            "Measured TTFT over the planner's prediction for the plan that ran, per planned request",
            ["plan"],
            buckets=PREDICTION_ERROR_BUCKETS,
            registry=r,
        )
        self.routes = Counter("blendserve_routes", "Routing decisions by reason", ["reason"], registry=r)
        self.queue_depth = Gauge(
            "blendserve_queue_depth", "Admitted, unfinished requests per worker", ["worker"], registry=r
        )
        self.evictions = Gauge(
            "blendserve_kv_evictions", "Chunks evicted so far, per store and tier", ["holder", "tier"], registry=r
        )
        self.workers_ready = Gauge("blendserve_workers_ready", "Workers with a loaded model", registry=r)
        self.worker_info = Gauge(
            "blendserve_worker_info",
            "1 per ready worker, labelled with its compute dtype and hardware",
            ["worker", "dtype", "hardware"],
            registry=r,
        )
        self.blending_refused = Gauge(
            "blendserve_blending_refused",
            "1 when the worker's canary gate failed (full prefill only)",
            ["worker"],
            registry=r,
        )
        self.shadow = Gauge(
            "blendserve_shadow",
            "Shadow comparison with full prefill per worker: completed, dropped, failed, "
            "top1_agreement, first_token_kl_mean, first_token_kl_max",
            ["worker", "figure"],
            registry=r,
        )

    def observe(self, finished: Finished) -> None:
        """Record one answered request's blend stats."""
        self.ttft.labels(finished.mode).observe(finished.ttft_s)
        for tier, num_tokens in finished.reused_tokens.items():
            self.reused_tokens.labels(tier).inc(num_tokens)
        self.recomputed_tokens.inc(finished.recomputed_tokens)
        self.recompute_ratio.observe(finished.recompute_ratio)
        self.plans.labels(finished.plan).inc()
        if finished.predicted_ttft_s:
            engine_ttft_s = finished.ttft_s - finished.queued_s  # what the prediction is of: no queue wait
            self.ttft_prediction_error.labels(finished.plan).observe(engine_ttft_s / finished.predicted_ttft_s)

    def set_state(
        self,
        queue_depths: Mapping[str, int],
        evictions: Mapping[tuple[str, str], int],
        reports: Mapping[str, WorkerReport],
    ) -> None:
        """Replace the gauges with the cluster's current state (workers that left disappear)."""
        self.queue_depth.clear()
        for worker, depth in queue_depths.items():
            self.queue_depth.labels(worker).set(depth)
        self.evictions.clear()
        for (holder, tier), count in evictions.items():
            self.evictions.labels(holder, tier).set(count)
        self.workers_ready.set(len(reports))
        self.worker_info.clear()
        self.blending_refused.clear()
        self.shadow.clear()
        for worker, report in reports.items():
            self.worker_info.labels(worker, report.dtype, report.hardware).set(1)
            self.blending_refused.labels(worker).set(int(report.blending_refused))
            for figure, value in report.shadow.items():
                self.shadow.labels(worker, figure).set(value)

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)
