"""Documents named by id: resolved from the tenant's document table, 404 naming an unknown id, GET and DELETE."""
import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.api.edge import Edge
from cluster.api.request_models import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DocumentsRequest,
    parse_request,
)
from cluster.config import LimitsConfig, ServeConfig, config_from_dict
from cluster.gateway import Gateway
from cluster.ingest.table import DocumentRecord, DocumentTable, TableLocation
from scheduler.membership import Member
from tests.cluster.test_gateway import ScriptedCluster, ScriptedWorkers
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model
from workers.worker import Finished, Job, TextDelta

TEXT = "The Eiffel Tower is a lattice tower in Paris, France."


class RecordingWorkers(ScriptedWorkers):
    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[Job] = []

    async def stream(self, job: Job, worker_id: str) -> AsyncIterator[TextDelta | Finished]:
        self.jobs.append(job)
        async for event in super().stream(job, worker_id):
            yield event


class DroppingCluster(ScriptedCluster):
    def __init__(self, members: list[Member]) -> None:
        super().__init__(members)
        self.dropped: list[str] = []

    async def drop_chunk(self, key: str) -> None:
        self.dropped.append(key)


@pytest.fixture(scope="module")
def card():
    return load_model_card(prepare_default_model())


@pytest.fixture
def setup(card, tmp_path: Path) -> tuple[Gateway, RecordingWorkers, DroppingCluster]:
    config = ServeConfig(data_dir=tmp_path)
    DocumentTable(TableLocation.of(config)).put("acme", DocumentRecord("doc-17.0", TEXT, "k17", 14, 1400, "fp"))
    workers, cluster = RecordingWorkers(), DroppingCluster([Member("w-a", "n1", "fp")])
    return Gateway(config, *card, workers, cluster), workers, cluster


def _body(documents: list[dict], chat: bool = True) -> bytes:
    question = {"messages": [{"role": "user", "content": "Where?"}]} if chat else {"prompt": "Where?"}
    return json.dumps({**question, "documents": documents}).encode()


def test_an_id_resolves_to_the_ingested_text_of_the_callers_tenant(setup) -> None:
    gate, workers, _ = setup
    documents = [{"id": "doc-17.0"}, {"text": "Mount Fuji is in Japan."}]
    asyncio.run(gate.complete(ChatCompletionRequest, _body(documents), "acme"))
    asyncio.run(gate.complete(CompletionRequest, _body(documents, chat=False), "acme"))
    assert [job.request.documents for job in workers.jobs] == [[TEXT, "Mount Fuji is in Japan."]] * 2


def test_an_unknown_id_is_a_404_naming_it(setup) -> None:
    gate, workers, _ = setup
    for tenant, doc_id in (("acme", "doc-99"), ("other", "doc-17.0")):  # another tenant's ids are not the caller's
        with pytest.raises(ApiError) as caught:
            asyncio.run(gate.complete(ChatCompletionRequest, _body([{"id": doc_id}]), tenant))
        assert caught.value.status_code == 404 and caught.value.code == "document_not_found"
        assert caught.value.message.startswith(f"documents[0].id: no document {doc_id!r}")
    assert workers.jobs == []


def test_an_id_with_a_text_stays_a_label(setup) -> None:
    gate, workers, _ = setup
    asyncio.run(gate.complete(ChatCompletionRequest, _body([{"id": "doc-17.0", "text": "Another text."}]), "acme"))
    assert workers.jobs[0].request.documents == ["Another text."]


def test_get_and_delete_by_id(setup) -> None:
    gate, _, cluster = setup
    info = asyncio.run(gate.document("doc-17.0", "acme"))
    assert (info.id, info.key, info.num_tokens, info.deleted) == ("doc-17.0", "k17", 14, False)
    assert asyncio.run(gate.delete_document("doc-17.0", "acme")).deleted and cluster.dropped == ["k17"]
    for call in (gate.document, gate.delete_document):
        with pytest.raises(ApiError) as caught:
            asyncio.run(call("doc-17.0", "acme"))
        assert caught.value.status_code == 404 and "no document 'doc-17.0'" in caught.value.message


def test_a_document_needs_a_text_or_an_id_and_storing_needs_the_text() -> None:
    with pytest.raises(ApiError, match=r"documents\[0\].text: must be given \(or the id of an ingested document\)"):
        parse_request(ChatCompletionRequest, _body([{}]), LimitsConfig())
    with pytest.raises(ApiError, match=r"documents\[0\].text: must be given to store a document"):
        parse_request(DocumentsRequest, json.dumps({"documents": [{"id": "doc-1"}]}).encode(), LimitsConfig())


def test_routes_by_id_take_the_tenant_from_the_headers() -> None:
    trusting = Edge.from_config(config_from_dict({"server": {"trust_tenant_header": True}}))
    assert trusting.tenant({"x-tenant": "acme"}) == "acme" and trusting.tenant({}) == "default"
    with pytest.raises(ApiError) as caught:
        Edge.from_config(ServeConfig()).tenant({"x-tenant": "acme"})
    assert caught.value.status_code == 403
