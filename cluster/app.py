"""The Ray Serve application: a FastAPI ingress in front of worker replicas; `build_app` is its import path."""
import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from ray import serve
from ray.serve import Application, Deployment
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from cluster.api.auth import KeyRing, check_exposure, load_api_keys
from cluster.api.edge import Edge
from cluster.api.request_models import ApiError, ChatCompletionRequest, CompletionRequest
from cluster.api.response_writer import stream_error
from cluster.cluster_view import RayClusterView, ServeWorkers
from cluster.config import ServeConfig, config_from_dict, config_to_dict
from cluster.gateway import Gateway
from cluster.hot_settings import admission_of, ingress_user_config, ttft_window_of, worker_user_config
from cluster.pinned_router import PinnedRequestRouter
from cluster.worker_setup import start_worker
from scheduler.autoscaling import AutoscalingPolicy, serve_autoscaling_config
from scheduler.serve_policy import TtftWindow
from workers.engines.base import StoredChunk
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model
from workers.worker import Event, Finished, Job

T = TypeVar("T")
_END = object()
_log = logging.getLogger(__name__)

api = FastAPI(title="blendserve", summary="OpenAI-compatible RAG serving with CacheBlend chunk-KV fusion")


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers)


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class Ingress:
    """HTTP edge: each route passes the Edge's checks, hands the body to the Gateway and answers what it returns."""

    def __init__(self, workers: DeploymentHandle, config: dict[str, Any]) -> None:
        serve_config = config_from_dict(config)
        model, tokenizer = load_model_card(serve_config.model.path or prepare_default_model())
        self.edge = Edge.from_config(serve_config)
        self.gateway = Gateway(serve_config, model, tokenizer, ServeWorkers(workers), RayClusterView())

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's hook for the hot settings (cluster.hot_settings): admission's limits, on this running replica."""
        self.gateway.set_admission(admission_of(user_config))

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self._answer("chat", request, partial(self.gateway.complete, ChatCompletionRequest))

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._answer("completions", request, partial(self.gateway.complete, CompletionRequest))

    @api.post("/v1/documents")
    async def documents(self, request: Request) -> Response:
        return await self._answer("documents", request, self.gateway.store_documents)

    @api.get("/v1/documents/{doc_id}")
    async def document(self, doc_id: str, request: Request) -> Response:
        return await self._by_id("documents", request, doc_id, self.gateway.document)

    @api.delete("/v1/documents/{doc_id}")
    async def delete_document(self, doc_id: str, request: Request) -> Response:
        return await self._by_id("documents", request, doc_id, self.gateway.delete_document)

    @api.get("/v1/models")
    async def models(self, request: Request) -> Response:
        try:
            self.edge.check_key(request.headers)
        except ApiError as error:
            return _error_response(error)
        return JSONResponse(self.gateway.models().model_dump())

    @api.get("/healthz")
    async def healthz(self) -> Response:
        return JSONResponse({"status": "ok"})

    @api.get("/readyz")
    async def readyz(self) -> Response:
        ready = await self.gateway.ready()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    def drain(self) -> int:
        """Refuse new requests from now on (503 + Retry-After); returns how many are still in flight."""
        self.edge.draining = True
        return self.in_flight()

    def in_flight(self) -> int:
        """Requests admitted by this replica and not finished (streams included)."""
        return self.edge.quota.total_in_flight()

    @api.get("/metrics")
    async def metrics(self, request: Request) -> Response:
        try:
            self.edge.check_key(request.headers, metrics=True)
        except ApiError as error:
            return _error_response(error)
        return Response(await self.gateway.render_metrics(), media_type="text/plain; version=0.0.4")

    async def _by_id(
        self, endpoint: str, request: Request, doc_id: str, work: Callable[[str, str], Awaitable[BaseModel]]
    ) -> Response:
        """A route without a body: the caller's tenant from the headers, then the gateway; errors become 4xx."""
        counter = self.gateway.metrics.requests
        try:
            answer = await work(doc_id, self.edge.tenant(request.headers))
        except ApiError as error:
            counter.labels(endpoint, str(error.status_code)).inc()
            return _error_response(error)
        counter.labels(endpoint, "200").inc()
        return JSONResponse(answer.model_dump(mode="json"))

    async def _answer(self, endpoint: str, request: Request, work: Callable[[bytes, str], Awaitable[Any]]) -> Response:
        """Check the caller and read the body, await the gateway; errors become 4xx/5xx, a stream becomes SSE."""
        counter = self.gateway.metrics.requests
        try:
            tenant, body = await self.edge.enter(request)
        except ApiError as error:
            counter.labels(endpoint, str(error.status_code)).inc()
            return _error_response(error)
        try:
            answer = await work(body, tenant)
        except Exception as error:  # a worker died or failed mid-request: the ingress stays up
            self.edge.leave(tenant)
            refusal = stream_error(error)
            if not isinstance(error, ApiError):
                _log.warning("blendserve: %s request failed: %r", endpoint, error)
            counter.labels(endpoint, str(refusal.status_code)).inc()
            return _error_response(refusal)
        counter.labels(endpoint, "200").inc()
        if isinstance(answer, BaseModel):
            self.edge.leave(tenant)
            return JSONResponse(answer.model_dump(mode="json"))
        return StreamingResponse(self.edge.leave_after(answer, tenant), media_type="text/event-stream")


@serve.deployment(request_router_config=RequestRouterConfig(request_router_class=PinnedRequestRouter))
class WorkerDeployment:
    """One worker replica: as many jobs at once as its engine batches (one for the torch engine); id = replica id."""

    def __init__(self, config: dict[str, Any]) -> None:
        worker_id = serve.get_replica_context().replica_id.unique_id
        serve_config = config_from_dict(config)
        self._ttfts = TtftWindow((serve_config.autoscaling or AutoscalingPolicy()).look_back_period_s)
        self._worker, self._heartbeat = start_worker(serve_config, worker_id)
        self._slots = asyncio.Semaphore(self._worker.engine.max_concurrent_jobs)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's hook for the hot settings (cluster.hot_settings): the TTFT window follows the policy's look-back."""
        window_s = ttft_window_of(user_config)
        if window_s != self._ttfts.window_s:
            self._ttfts = TtftWindow(window_s)

    async def stream(self, job: Job, worker_id: str | None = None) -> AsyncIterator[Event]:
        received_s = time.perf_counter()  # TTFT counts from here: the wait for a slot is the worker's too
        async with self._slots:
            async for event in _in_thread(self._worker.run(job, received_s)):
                if isinstance(event, Finished):
                    self._ttfts.add(event.ttft_s, time.monotonic())
                yield event

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's hook: this replica's TTFT p95 for the autoscaling policy (the queue is Serve's own count)."""
        return self._ttfts.autoscaling_stats(time.monotonic())

    async def store_documents(
        self, documents: list[str], namespace: str, worker_id: str | None = None
    ) -> list[StoredChunk]:
        async with self._slots:
            return await asyncio.to_thread(self._worker.store_documents, documents, namespace)

    def __del__(self) -> None:
        # Serve calls this on shutdown; a replica whose start failed has nothing to stop.
        if hasattr(self, "_heartbeat"):
            self._heartbeat.stop()
            self._worker.engine.close()


async def _in_thread(items: Iterator[T]) -> AsyncIterator[T]:
    """Drive a blocking iterator from a worker thread, closing it however the consumer stops."""
    # A cancelled consumer (the client went away) leaves a step running in its thread; closing waits for that
    # step under the lock, so the generator is closed, never closed while it runs, and stops generating.
    stepping = threading.Lock()

    def step() -> T | object:
        with stepping:
            return next(items, _END)

    def close() -> None:
        with stepping:
            items.close()

    try:
        while (item := await asyncio.to_thread(step)) is not _END:
            yield item
    finally:
        await asyncio.to_thread(close)


def worker_options(config: ServeConfig) -> dict[str, Any]:
    """Replicas (or autoscaling), resources, concurrency and hot settings of the worker deployment."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": config.workers.num_cpus, "num_gpus": config.workers.num_gpus},
        # Admission bounds each worker's queue; Serve must not hold back what admission let through.
        "max_ongoing_requests": config.admission.max_queued_per_worker + 1,
        "user_config": worker_user_config(config),
    }
    if config.autoscaling is None:
        options["num_replicas"] = config.workers.num_replicas
    else:
        # Start from the configured count (within the policy's bounds, as the configuration checks). Only here,
        # where each `serve.run` deploys anew: a deploy config that kept initial_replicas would reset the count to
        # it on every change (Ray 2.60 AutoscalingState.register), so the chart's overrides leave it out.
        options["autoscaling_config"] = {
            **serve_autoscaling_config(config.autoscaling),
            "initial_replicas": config.workers.num_replicas,
        }
    return options


def ingress_options(config: ServeConfig) -> dict[str, Any]:
    """Replicas, concurrency and hot settings of the ingress deployment."""
    return {
        # One ingress: its admission counters see every request, and /metrics through any Serve proxy is its own.
        "num_replicas": 1,
        # Health checks and 429s must get through while streams run: Serve's default of 5 would queue them.
        "max_ongoing_requests": config.server.max_ongoing_requests,
        "user_config": ingress_user_config(config),
    }


def build_app(args: dict[str, Any] | None = None) -> Application:
    """The application `serve run cluster.app:build_app` or a RayService `import_path` loads."""
    return assemble(config_from_dict(args), WorkerDeployment)


def assemble(config: ServeConfig, workers: Deployment) -> Application:
    """The ingress in front of `workers` (the worker deployment, or a deployment of the same name and surface)."""
    plain = config_to_dict(config)
    check_exposure(config.server, KeyRing(load_api_keys(config.server)))
    bound = workers.options(**worker_options(config)).bind(plain)
    return Ingress.options(**ingress_options(config)).bind(bound, plain)
