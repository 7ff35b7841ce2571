"""The ingress's logic: parse, route by cache affinity, admit, run on a worker, respond."""
import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar

from transformers import PreTrainedTokenizerBase

from cluster.api.documents import find_document, resolve_documents
from cluster.api.request_models import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DocumentsRequest,
    check_model,
    parse_request,
)
from cluster.api.response_models import (
    ChatCompletion,
    Completion,
    DocumentInfo,
    DocumentsResponse,
    ModelCard,
    ModelList,
    StoredDocument,
)
from cluster.api.response_writer import ResponseFrame, collect, sse
from cluster.cluster_view import ClusterView, Copies, WorkerClient
from cluster.config import ServeConfig
from cluster.ingest.table import DocumentTable, TableLocation
from cluster.kv_metrics import KVMetrics
from cluster.metrics import ServeMetrics
from cluster.prompting import PreparedRequest, check_context_length, check_served, prepare_request
from kvplane.ray.shard import SHARD_NAME_PREFIX
from kvplane.tiers.spec import open_tier
from scheduler.admission import Admission, AdmissionConfig, Rejected
from scheduler.membership import Member
from scheduler.placement import worker_locations
from scheduler.router import Router, RouteReason
from scheduler.scoring import Chunk
from workers.chunks.kvplane_store import route_keys
from workers.chunks.sources import ChunkSources
from workers.engines.base import BlendRequest, EngineLimits
from workers.fusion.registry import FUSION_MODES
from workers.generation.prompt import PromptLayout
from workers.model.config import ModelConfig
from workers.model.dtype import dtype_width_bytes
from workers.worker import Event, Finished, Job

NO_WORKER_RETRY_AFTER_S = 5
T = TypeVar("T")

_log = logging.getLogger(__name__)


class Gateway:
    """One per ingress replica; its admission counters and metrics belong to this replica alone."""

    def __init__(
        self,
        config: ServeConfig,
        model: ModelConfig,
        tokenizer: PreTrainedTokenizerBase,
        workers: WorkerClient,
        cluster: ClusterView,
    ) -> None:
        self.config = config
        self.served_model = config.model.served_name
        # What the workers' engines serve: refreshed from their reports (vLLM's max_model_len may be smaller).
        self.limits = EngineLimits(model.max_position_embeddings, frozenset(FUSION_MODES))
        # K and V of one token in every layer, per byte of the workers' dtype (they report it).
        self.values_per_token = model.kv_values_per_token
        self.template = config.prompt.template(tokenizer)
        self.sources = ChunkSources.for_model(config.engine.chunk_context, model)
        self.router = Router(config.router)
        self.admission = Admission(config.admission)
        self.metrics = ServeMetrics()
        self.kv_metrics = KVMetrics(self.metrics.registry, {tier.name: tier.compression for tier in config.tiers or ()})
        self.workers = workers
        self.cluster = cluster
        self.tokens_in_flight: dict[str, int] = defaultdict(int)
        self.created = int(time.time())
        self.documents = DocumentTable(TableLocation.of(config))  # ingested documents, by tenant and id
        # One thread: parsing and tokenizing leave the event loop, and the tokenizer is never used concurrently.
        self._parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blendserve-parse")

    def set_admission(self, admission: AdmissionConfig) -> None:
        """Admission's new limits, from the next request on (a hot update); admitted requests keep their slots."""
        self.config = replace(self.config, admission=admission)
        self.admission.reconfigure(admission)

    async def complete(
        self, kind: type[ChatCompletionRequest] | type[CompletionRequest], body: bytes, tenant: str
    ) -> ChatCompletion | Completion | AsyncIterator[bytes]:
        """A chat or text completion for `tenant`: the whole response, or server-sent events when `stream` is set."""
        arrived_s = time.perf_counter()
        members = await self.cluster.members()  # asked once per request: a round trip to the membership actor
        self._shed_when_full(members)
        # Parsing and tokenizing take milliseconds per request: off the event loop, so health checks and
        # other streams keep flowing while a burst of requests is read.
        prepared, prompt = await self._off_loop(self._prepare_completion, kind, body, tenant)
        cost = len(prompt.token_ids) + prepared.blend.sampling.max_new_tokens
        field = "messages" if kind is ChatCompletionRequest else "prompt"
        worker_id = await self._admit(members, prompt, tenant, cost, (prepared.blend, field))
        events = self._run(Job(prepared.blend, prepared.stop), worker_id, cost, arrived_s)
        frame = ResponseFrame(kind is ChatCompletionRequest, self.served_model)
        if prepared.stream:
            return sse(frame, events, prepared.include_usage)
        text, finished = await collect(events)
        return frame.complete(text, finished)

    async def store_documents(self, body: bytes, tenant: str) -> DocumentsResponse:
        """Compute and keep the KV of documents ahead of requests (idempotent), under `tenant`."""
        request, texts, prompt = await self._off_loop(self._prepare_documents, body)
        cost = len(prompt.token_ids)
        worker_id = await self._admit(await self.cluster.members(), prompt, tenant, cost)
        start_s = time.monotonic()
        try:
            stored = await self.workers.store_documents(texts, tenant, worker_id)
        finally:
            self._release(worker_id, cost, start_s)
        data = [
            StoredDocument(
                id=document.id,
                key=chunk.key,
                num_tokens=chunk.num_tokens,
                tiers=chunk.tiers,
                computed=chunk.computed,
                worker=worker_id,
            )
            for document, chunk in zip(request.documents, stored)
        ]
        return DocumentsResponse(data=data)

    async def document(self, doc_id: str, tenant: str) -> DocumentInfo:
        """An ingested document's metadata (404 when the tenant has none of that id)."""
        record = await self._off_loop(find_document, self.documents, tenant, doc_id)
        return DocumentInfo(**record.metadata())

    async def delete_document(self, doc_id: str, tenant: str) -> DocumentInfo:
        """Remove an ingested document and its chunk KV from the shards and the object tier (404 when unknown).

        Copies in workers' own memory are not reached: they age out, and a request naming the id is a 404 at once.
        """
        record = await self._off_loop(find_document, self.documents, tenant, doc_id)
        await self._off_loop(self.documents.delete, tenant, doc_id)
        await self.cluster.drop_chunk(record.key)
        shared = self.config.tier("object")
        if shared is not None:
            await self._off_loop(lambda: open_tier(shared.to_spec()).delete(record.key))
        return DocumentInfo(**record.metadata(), deleted=True)

    async def _off_loop(self, work: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._parser, work, *args)

    def _prepare_completion(
        self, kind: type[ChatCompletionRequest] | type[CompletionRequest], body: bytes, tenant: str
    ) -> tuple[PreparedRequest, PromptLayout]:
        """Parse and lay out a completion request of `tenant` (4xx on a bad one); runs in a thread."""
        request = parse_request(kind, body, self.config.limits)
        check_model(request.model, self.served_model)
        request = resolve_documents(request, self.documents, tenant)
        prepared = prepare_request(request, self.config)
        blend = prepared.blend
        prompt = self.template.layout(blend.documents, blend.question, blend.conversation)
        # Sent along: the worker runs this layout, never tokenizing the request again.
        return replace(prepared, blend=replace(blend, namespace=tenant, prompt=prompt)), prompt

    def _prepare_documents(self, body: bytes) -> tuple[DocumentsRequest, list[str], PromptLayout]:
        """Parse, check and lay out a documents upload (4xx on a bad one); runs in a thread."""
        request = parse_request(DocumentsRequest, body, self.config.limits)
        check_model(request.model, self.served_model)
        texts = [document.text for document in request.documents]
        prompt = self.template.layout(texts, "")
        for i, ids in enumerate(prompt.chunk_ids):
            check_context_length(
                len(prompt.prefix_ids) + len(ids), 0, self.limits.max_context_tokens, f"documents[{i}].text"
            )
        return request, texts, prompt

    def models(self) -> ModelList:
        """The one served model."""
        return ModelList(data=[ModelCard(id=self.served_model, created=self.created)])

    async def ready(self) -> bool:
        """Whether some worker has its model loaded."""
        return bool(await self.cluster.members())

    async def render_metrics(self) -> bytes:
        """Prometheus text, with queue depths and evictions read now."""
        members = await self.cluster.members()
        evictions = {(m.worker_id, tier): count for m in members for tier, count in m.report.evictions.items()}
        try:
            evictions.update(await self.cluster.shard_evictions())
        except Exception:  # a shard that does not answer leaves its series out of this scrape
            _log.warning("blendserve: a shard did not report its stats", exc_info=True)
        queues = {m.worker_id: self.admission.num_queued(m.worker_id) for m in members}
        self.metrics.set_state(queues, evictions, {m.worker_id: m.report for m in members})
        await self.kv_metrics.scrape({m.worker_id: m.report.kv for m in members})
        return self.metrics.render()

    def _shed_when_full(self, members: list[Member]) -> None:
        """429 before the body is parsed when every worker is at its queue bound: under overload a refusal costs
        no parsing or tokenizing (their one thread would otherwise queue the refusals behind each other)."""
        verdict = self.admission.all_full([m.worker_id for m in members])
        if verdict is not None:
            self.metrics.routes.labels(RouteReason.SATURATED.value).inc()  # as if routed: every worker is full
            raise self._too_many(verdict)

    def _too_many(self, verdict: Rejected) -> ApiError:
        bound = self.config.admission.max_queued_per_worker
        retry_after_s = math.ceil(verdict.retry_after_s)
        message = f"every worker that could serve this is at its queue bound of {bound}; retry in {retry_after_s} s"
        return ApiError(429, message, None, "rate_limit_exceeded", {"Retry-After": str(retry_after_s)})

    async def _admit(
        self,
        members: list[Member],
        prompt: PromptLayout,
        tenant: str,
        cost: int,
        checked: tuple[BlendRequest, str] | None = None,
    ) -> str:
        """Route to the worker with the best cache affinity for load, and hold a slot in its queue.

        `checked` (the request and its prompt's field) is checked again against the workers' current limits.
        """
        if not members:
            message = "no worker is ready yet (the model is still loading); retry shortly"
            headers = {"Retry-After": str(NO_WORKER_RETRY_AFTER_S)}
            raise ApiError(503, message, None, "service_unavailable", headers)
        reported = [m.report.max_context_tokens for m in members if m.report.max_context_tokens > 0]
        if reported:
            self.limits = replace(self.limits, max_context_tokens=min(reported))
        if checked is not None:
            check_served(checked[0], len(prompt.token_ids), self.limits, checked[1])
        bytes_per_token = self.values_per_token * dtype_width_bytes(members[0].report.dtype)
        keys = route_keys(self.sources, prompt, members[0].fingerprint, tenant)
        chunks = [Chunk(key, len(ids) * bytes_per_token) for key, ids in zip(keys, prompt.chunk_ids)]
        copies = await self._copies([chunk.key for chunk in chunks]) if chunks else {}
        holders = {holder for found in copies.values() for holder, _ in found}
        shard_nodes = {h: h.removeprefix(SHARD_NAME_PREFIX) for h in holders if h.startswith(SHARD_NAME_PREFIX)}
        worker_nodes = {m.worker_id: m.node_id for m in members}
        locations = worker_locations(copies, worker_nodes, shard_nodes, self.config.router)
        loads = {w: self.admission.load(w, self.tokens_in_flight[w]) for w in worker_nodes}
        route = self.router.route(chunks, locations, loads)
        self.metrics.routes.labels(route.reason.value).inc()
        verdict = self.admission.try_admit(route.worker_id)
        if isinstance(verdict, Rejected):
            raise self._too_many(verdict)
        self.tokens_in_flight[route.worker_id] += cost
        return route.worker_id

    async def _copies(self, keys: list[str]) -> Copies:
        """Where the chunks are cached; the index only steers routing, so when it fails requests route cold."""
        try:
            return await self.cluster.copies(keys)
        except Exception:
            _log.warning("blendserve: the location index did not answer; routing without cache affinity", exc_info=True)
            return {}

    def _release(self, worker_id: str, cost: int, start_s: float) -> None:
        self.admission.finish(worker_id, time.monotonic() - start_s)
        self.tokens_in_flight[worker_id] -= cost

    async def _run(self, job: Job, worker_id: str, cost: int, arrived_s: float) -> AsyncIterator[Event]:
        """The worker's events, Finished stamped with the ingress's time before it (since `arrived_s`, perf_counter);
        the queue slot is freed when they end, however they end."""
        start_s = time.monotonic()
        ingress_s = time.perf_counter() - arrived_s
        try:
            async for event in self.workers.stream(job, worker_id):
                if isinstance(event, Finished):
                    event = replace(event, ingress_s=ingress_s)
                    self.metrics.observe(event)
                yield event
        finally:
            self._release(worker_id, cost, start_s)
