"""Gateway logic with a scripted cluster and workers (the real app is tested in test_serving.py)."""
import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from cluster.api.request_models import ApiError, ChatCompletionRequest
from cluster.config import ServeConfig
from cluster.gateway import Gateway
from scheduler.membership import Member, WorkerReport
from workers.engines.base import StoredChunk
from workers.engines.torch_engine import load_torch_engine
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model
from workers.worker import Finished, Job, TextDelta, Worker


class ScriptedCluster:
    def __init__(self, members: list[Member], holder: str | None = None, index_down: bool = False) -> None:
        self._members = members
        self._holder = holder
        self._index_down = index_down

    async def members(self) -> list[Member]:
        return self._members

    async def copies(self, keys: list[str]) -> dict[str, list[tuple[str, str]]]:
        if self._index_down:
            raise ConnectionError("location index is gone")
        return {key: [(self._holder, "device")] if self._holder else [] for key in keys}

    async def shard_evictions(self) -> dict[tuple[str, str], int]:
        return {}


class ScriptedWorkers:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self._fail = fail

    async def stream(self, job: Job, worker_id: str) -> AsyncIterator[TextDelta | Finished]:
        self.calls.append(worker_id)
        yield TextDelta("Paris")
        if self._fail:
            raise ConnectionError("replica died")
        yield Finished("stop", 10, 2, 0.1, "cacheblend", 0.15, {}, 10, worker_id)

    async def store_documents(self, documents: list[str], namespace: str, worker_id: str) -> list[StoredChunk]:
        return []


@pytest.fixture(scope="module")
def card():
    return load_model_card(prepare_default_model())


def gateway(card, cluster, workers) -> Gateway:
    model, tokenizer = card
    return Gateway(ServeConfig(), model, tokenizer, workers, cluster)


def request_body() -> bytes:
    body = {"messages": [{"role": "user", "content": "Where?"}], "documents": [{"text": "Paris is in France."}]}
    return json.dumps(body).encode()


def test_no_ready_worker_is_a_503_with_retry_after(card):
    with pytest.raises(ApiError) as caught:
        gate = gateway(card, ScriptedCluster([]), ScriptedWorkers())
        asyncio.run(gate.complete(ChatCompletionRequest, request_body(), "default"))
    assert caught.value.status_code == 503 and caught.value.headers["Retry-After"] == "5"


def test_the_worker_holding_the_chunks_gets_the_request(card):
    members = [Member("w-a", "n1", "fp"), Member("w-b", "n1", "fp")]
    workers = ScriptedWorkers()
    gate = gateway(card, ScriptedCluster(members, "w-b"), workers)
    response = asyncio.run(gate.complete(ChatCompletionRequest, request_body(), "default"))
    assert workers.calls == ["w-b"]
    assert response.blend.worker == "w-b" and response.choices[0].message.content == "Paris"


def test_a_failing_worker_frees_its_queue_slot(card):
    members = [Member("w-a", "n1", "fp")]
    gate = gateway(card, ScriptedCluster(members), ScriptedWorkers(fail=True))
    for _ in range(3):
        with pytest.raises(ConnectionError):
            asyncio.run(gate.complete(ChatCompletionRequest, request_body(), "default"))
    assert gate.admission.num_queued("w-a") == 0 and gate.tokens_in_flight["w-a"] == 0


def test_a_dead_location_index_routes_cold_instead_of_failing(card):
    members = [Member("w-a", "n1", "fp"), Member("w-b", "n1", "fp")]
    workers = ScriptedWorkers()
    gate = gateway(card, ScriptedCluster(members, "w-b", index_down=True), workers)
    response = asyncio.run(gate.complete(ChatCompletionRequest, request_body(), "default"))
    assert response.choices[0].message.content == "Paris" and len(workers.calls) == 1
    assert 'blendserve_routes_total{reason="cold"} 1.0' in gate.metrics.render().decode()


def test_a_prompt_over_the_engines_reported_context_is_a_400_naming_the_field(card):
    # vLLM's max_model_len can be below the model's context: the gateway holds requests to what workers report.
    members = [Member("w-a", "n1", "fp", report=WorkerReport(max_context_tokens=64))]
    workers = ScriptedWorkers()
    gate = gateway(card, ScriptedCluster(members), workers)
    with pytest.raises(ApiError) as caught:
        asyncio.run(gate.complete(ChatCompletionRequest, request_body(), "default"))
    error = caught.value
    assert error.status_code == 400 and error.param == "messages" and "context of 64 tokens" in str(error)
    assert workers.calls == [] and gate.limits.max_context_tokens == 64
    with pytest.raises(ApiError) as again:  # now known up front, before any worker is asked
        asyncio.run(gate.complete(ChatCompletionRequest, request_body(), "default"))
    assert again.value.status_code == 400 and workers.calls == []


def test_a_full_cluster_refuses_with_429_before_parsing_the_body(card):
    members = [Member("w-a", "n1", "fp"), Member("w-b", "n1", "fp")]
    workers = ScriptedWorkers()
    gate = gateway(card, ScriptedCluster(members), workers)
    bound = gate.config.admission.max_queued_per_worker
    for worker in ("w-a", "w-b"):
        for _ in range(bound):
            gate.admission.try_admit(worker)
    with pytest.raises(ApiError) as caught:  # not a 400: the body is never read
        asyncio.run(gate.complete(ChatCompletionRequest, b"{not json", "default"))
    assert caught.value.status_code == 429 and int(caught.value.headers["Retry-After"]) >= 1
    assert 'blendserve_routes_total{reason="saturated"} 1.0' in gate.metrics.render().decode()
    gate.admission.finish("w-a", 1.0)  # one slot free: requests are parsed and served again
    response = asyncio.run(gate.complete(ChatCompletionRequest, request_body(), "default"))
    assert response.choices[0].message.content == "Paris" and workers.calls == ["w-a"]


class InProcessWorkers:
    """The WorkerClient over one real Worker (torch engine, the default model) in this process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def stream(self, job: Job, worker_id: str) -> AsyncIterator[TextDelta | Finished]:
        for event in self.worker.run(job):
            yield event

    async def store_documents(self, documents: list[str], namespace: str, worker_id: str) -> list[StoredChunk]:
        return self.worker.store_documents(documents, namespace)


def test_a_request_is_tokenized_once_on_its_way_through_the_gateway_and_the_worker(card, monkeypatch):
    engine = load_torch_engine(dtype="float32")
    calls: list[str] = []
    tokenizer_class = type(engine.tokenizer)
    for name in ("__call__", "encode", "apply_chat_template"):
        original = getattr(tokenizer_class, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(tokenizer_class, name, counted)
    gate = gateway(card, ScriptedCluster([Member("w-a", "n1", "fp")]), InProcessWorkers(Worker(engine, "w-a")))
    calls.clear()  # what building the gateway's template cost is paid once, not per request
    template = engine.fuser.template
    template.layout(["Paris is in France."], "Where?")
    one_layout = len(calls)  # what laying out one request costs the tokenizer
    calls.clear()
    response = asyncio.run(gate.complete(ChatCompletionRequest, request_body(), "default"))
    assert response.blend.worker == "w-a" and response.usage.prompt_tokens > 0
    assert one_layout > 0 and len(calls) == one_layout, calls
