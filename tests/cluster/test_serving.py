"""The served app end to end: openai client, cache reuse, affinity, streaming, documents API, metrics."""
import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvplane.buffers import owned_blob
from kvplane.codec import read_header
from kvplane.keys import is_chunk_key

MODEL = "SmolLM2-135M-Instruct"
DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889.",
    "Mount Fuji is the highest mountain in Japan, at 3,776 metres.",
    "The Danube flows through Vienna, Budapest and Belgrade before it reaches the Black Sea.",
]
QUESTION = "In which city is the Eiffel Tower?"
BLEND_KEYS = {
    "ttft_s", "mode", "recompute_ratio", "reused_tokens", "recomputed_tokens", "worker", "plan", "predicted_ttft_s",
    "queued_s", "stages_s", "ingress_s",
}


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client: openai.OpenAI, documents: list[str], question: str = QUESTION, tenant: str | None = None, **extra):
    headers = {"X-Tenant": tenant} if tenant else None
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=12,
        extra_body={"documents": [{"text": d} for d in documents], **extra}, extra_headers=headers,
    )


def metric(server: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{server}/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_chat_with_documents_answers_and_reuses_the_chunks_the_second_time(client, server):
    first = chat(client, DOCS, tenant="reuse")
    assert "paris" in first.choices[0].message.content.lower()
    blend = first.model_extra["blend"]
    assert set(blend) == BLEND_KEYS
    assert blend["mode"] == "cacheblend" and blend["recompute_ratio"] == 0.15
    assert blend["reused_tokens"] == {}  # nothing cached yet
    # Where the worker's TTFT went: its stages, the queue for a slot besides, add up to it.
    assert blend["stages_s"]["fusion"] > 0
    assert blend["queued_s"] + sum(blend["stages_s"].values()) == pytest.approx(blend["ttft_s"], abs=1e-5)
    assert 0 < blend["ingress_s"] < 5  # the ingress's own time before the worker got the job (tokenizing, routing)
    assert first.usage.prompt_tokens == blend["recomputed_tokens"] > 0

    # The shadow comparison of the first request runs off the hot path; let it finish so it cannot slow the
    # second request's prefill, and check it reached /metrics through the worker's heartbeat.
    worker = blend["worker"]
    deadline_s = time.monotonic() + 60
    while metric(server, "blendserve_shadow", worker=worker, figure="completed") < 1 and time.monotonic() < deadline_s:
        time.sleep(0.5)
    assert metric(server, "blendserve_shadow", worker=worker, figure="completed") >= 1
    assert 0.0 <= metric(server, "blendserve_shadow", worker=worker, figure="first_token_kl_mean") < 1.0
    assert metric(server, "blendserve_blending_refused", worker=worker) == 0.0  # the canary gate passed

    reused_before = sum(metric(server, "blendserve_reused_tokens_total", tier=t) for t in ("device", "ram", "ssd"))
    second = chat(client, [DOCS[2], "Budapest is the capital of Hungary.", DOCS[0], DOCS[1]], tenant="reuse")
    again = second.model_extra["blend"]
    assert again["worker"] == blend["worker"]  # routed to the replica holding the chunks
    assert again["reused_tokens"].get("device", 0) > 0
    assert again["recomputed_tokens"] < second.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == sum(again["reused_tokens"].values())
    reused_after = sum(metric(server, "blendserve_reused_tokens_total", tier=t) for t in ("device", "ram", "ssd"))
    assert reused_after - reused_before == sum(again["reused_tokens"].values())


def test_tenants_do_not_share_cached_chunks(client):
    chat(client, DOCS[:2], tenant="acme")
    other = chat(client, DOCS[:2], tenant="globex").model_extra["blend"]
    same = chat(client, DOCS[:2], tenant="acme").model_extra["blend"]
    assert other["reused_tokens"] == {}
    assert sum(same["reused_tokens"].values()) > 0


def test_streaming_sends_deltas_then_the_blend_stats(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, stream=True,
        stream_options={"include_usage": True},
        extra_body={"documents": [{"text": d} for d in DOCS], "blend": {"mode": "full_prefill"}},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "paris" in text.lower()
    closing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    # A stream chunk leaves out what is null, as OpenAI's do: this app plans nothing, so no prediction.
    assert len(closing) == 1 and set(closing[0].model_extra["blend"]) == BLEND_KEYS - {"predicted_ttft_s"}
    assert closing[0].model_extra["blend"]["mode"] == "full_prefill"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    completion = "".join(
        c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt=QUESTION, max_tokens=12, stream=True,
            extra_body={"documents": [{"text": d} for d in DOCS], "blend": {"mode": "full_prefill"}},
        )
    )
    assert completion.strip() == text.strip()


def test_documents_api_is_idempotent_and_feeds_later_requests(server, client):
    body = {"documents": [{"id": "danube", "text": DOCS[2]}, {"text": "Lake Baikal is the deepest lake."}]}
    first = httpx.post(f"{server}/v1/documents", json=body, headers={"X-Tenant": "docs"}, timeout=120)
    assert first.status_code == 200, first.text
    stored = first.json()["data"]
    assert [d["id"] for d in stored] == ["danube", None]
    assert all(d["computed"] and "device" in d["tiers"] and d["num_tokens"] > 0 for d in stored)
    again = httpx.post(f"{server}/v1/documents", json=body, headers={"X-Tenant": "docs"}, timeout=120).json()["data"]
    assert [d["key"] for d in again] == [d["key"] for d in stored] and not any(d["computed"] for d in again)

    answer = chat(client, [DOCS[2]], "Which sea does the Danube reach?", tenant="docs").model_extra["blend"]
    assert answer["worker"] == stored[0]["worker"]
    assert sum(answer["reused_tokens"].values()) >= stored[0]["num_tokens"]


def test_a_corpus_ingested_on_the_serving_cluster_is_named_by_id(served, client, tmp_path):
    from cluster.config import config_from_dict
    from cluster.ingest.pipeline import IngestJob, run_ingest
    from workers.model.checkpoint import load_model_card
    from workers.model.default import prepare_default_model

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"ing-{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    config = config_from_dict(served.config)
    job = IngestJob(str(corpus), str(tmp_path / "manifest.parquet"), str(tmp_path / "refused.jsonl"),
                    tenant="ingest", num_actors=1)
    summary = run_ingest(config, job)  # on the app's own Ray: its shards, its document table, its dtype
    assert (summary.num_computed_chunks, summary.num_refused) == (3, 0)

    documents = {"documents": [{"id": "ing-2"}, {"id": "ing-0"}]}
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                            max_tokens=12, extra_body=documents, extra_headers={"X-Tenant": "ingest"})
    _, tokenizer = load_model_card(prepare_default_model())
    prompt = config.prompt.template(tokenizer).layout([DOCS[2], DOCS[0]], QUESTION)
    context_tokens = len(prompt.prefix_ids) + sum(map(len, prompt.chunk_ids))
    assert sum(answer.model_extra["blend"]["reused_tokens"].values()) == context_tokens  # every ingested chunk

    unknown = httpx.post(f"{served.base_url}/v1/chat/completions", headers={"X-Tenant": "other"}, timeout=60,
                         json={"messages": [{"role": "user", "content": QUESTION}], "documents": [{"id": "ing-0"}]})
    assert unknown.status_code == 404 and "documents[0].id: no document 'ing-0'" in unknown.json()["error"]["message"]

    url, ingest = f"{served.base_url}/v1/documents/ing-0", {"X-Tenant": "ingest"}
    found = httpx.get(url, headers=ingest, timeout=60)
    assert found.status_code == 200 and found.json()["id"] == "ing-0" and found.json()["num_tokens"] > 0
    assert httpx.get(url, headers={"X-Tenant": "other"}, timeout=60).status_code == 404
    deleted = httpx.delete(url, headers=ingest, timeout=60)
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert httpx.get(url, headers=ingest, timeout=60).status_code == 404
    gone = httpx.post(f"{served.base_url}/v1/chat/completions", headers=ingest, timeout=60,
                      json={"messages": [{"role": "user", "content": QUESTION}], "documents": [{"id": "ing-0"}]})
    assert gone.status_code == 404

    # The ingest actors' Prometheus counters, through Ray's metrics export of the node (flushed every few seconds).
    import ray

    port = ray.nodes()[0]["MetricsExportPort"]
    deadline_s, counted = time.monotonic() + 60, {}
    while counted.get("chunks") != 3.0 and time.monotonic() < deadline_s:
        for family in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text):
            for sample in family.samples:
                if sample.labels.get("tenant") == "ingest" and sample.labels.get("outcome") == "computed":
                    name = sample.name.removeprefix("ray_blendserve_ingest_").removesuffix("_total")
                    counted[name] = counted.get(name, 0.0) + sample.value
        time.sleep(1)
    assert counted["chunks"] == 3.0 and counted["tokens"] == summary.num_tokens


def test_a_chat_with_a_system_prompt_reuses_stored_chunks_on_every_turn_streamed_or_not(server, client):
    # Chunks stored through the documents API are computed after the template's own prefix: a chat with a
    # system prompt of its own still reads them (prompt.chunks_after: default_prefix).
    stored = httpx.post(f"{server}/v1/documents", json={"documents": [{"text": d} for d in DOCS]},
                        headers={"X-Tenant": "chat"}, timeout=120).json()["data"]
    chunk_tokens = sum(d["num_tokens"] for d in stored)
    documents = {"documents": [{"text": d} for d in DOCS]}
    messages = [{"role": "system", "content": "You are a travel guide. Answer in a few words."},
                {"role": "user", "content": QUESTION}]
    turns = []
    for turn, question in enumerate((None, "When was it completed?", "Which river flows through Vienna?")):
        if question is not None:
            messages += [{"role": "assistant", "content": turns[-1][0]}, {"role": "user", "content": question}]
        if turn < 2:
            answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                                    extra_body=documents, extra_headers={"X-Tenant": "chat"})
            turns.append((answer.choices[0].message.content, answer.model_extra["blend"], answer.usage))
        else:
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=12, stream=True, stream_options={"include_usage": True},
                extra_body=documents, extra_headers={"X-Tenant": "chat"}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            closing = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
            turns.append((text, closing.model_extra["blend"], chunks[-1].usage))
    assert "paris" in turns[0][0].lower()
    for text, blend, usage in turns:
        assert text.strip() and blend["mode"] == "cacheblend"
        assert sum(blend["reused_tokens"].values()) >= chunk_tokens  # every chunk, on every turn
        assert usage.prompt_tokens > blend["recomputed_tokens"]
    assert turns[2][2].prompt_tokens > turns[1][2].prompt_tokens > turns[0][2].prompt_tokens  # the turns grow
    for _, blend, _ in turns[1:]:  # the prefix holding the earlier turns was stored between turns: reused too
        assert sum(blend["reused_tokens"].values()) > chunk_tokens

    refused = [
        ([*messages[:2], {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}, messages[1]],
         "messages[2].tool_calls"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
         "messages[0].content[0].type"),
    ]
    for bad, field in refused:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, messages=bad, max_tokens=4, extra_body=documents)
        assert caught.value.body["param"] == field and "not supported yet" in caught.value.body["message"]


def test_shared_chunks_go_to_their_holder_until_it_is_full(server, client):
    from concurrent.futures import ThreadPoolExecutor

    docs = ["Ottawa is the capital of Canada.", "Canberra is the capital of Australia."]
    home = chat(client, docs, "What is the capital of Canada?", tenant="spread").model_extra["blend"]["worker"]

    def ask(i: int) -> httpx.Response:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"Capital of Australia? ({i})"}],
                "documents": [{"text": d} for d in docs], "max_tokens": 48}
        return httpx.post(f"{server}/v1/chat/completions", json=body, headers={"X-Tenant": "spread"}, timeout=180)

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(ask, range(6)))
    served = [r.json()["blend"]["worker"] for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert served.count(home) == 2  # its queue bound; then the others spill over
    assert len(set(served)) == 2
    assert len(served) + len(refused) == 6 and refused  # two workers x two slots < six requests
    assert all(int(r.headers["Retry-After"]) >= 1 and "queue bound" in r.json()["error"]["message"] for r in refused)
    # Queued work outweighs the holder's affinity, so the second worker takes the overflow by score.
    assert metric(server, "blendserve_routes_total", reason="saturated") >= len(refused)


def test_models_health_and_metrics(server):
    assert httpx.get(f"{server}/v1/models").json()["data"][0]["id"] == MODEL
    assert httpx.get(f"{server}/healthz").status_code == 200
    assert httpx.get(f"{server}/readyz").json() == {"ready": True}
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{server}/metrics").text)}
    for name in ("blendserve_requests", "blendserve_ttft_seconds", "blendserve_reused_tokens",
                 "blendserve_recompute_ratio", "blendserve_plans", "blendserve_queue_depth", "blendserve_kv_evictions"):
        assert name in families, name
    assert families["blendserve_ttft_seconds"].type == "histogram"
    assert any(s.value > 0 for s in families["blendserve_requests"].samples)


# The chart's dashboard is checked here, against this module's live app after the traffic above (no second server).
from tests.cluster.dashboard_metrics import test_every_dashboard_query_names_an_exported_metric  # noqa: E402,F401


def test_the_node_tiers_compress_as_their_verdicts_allow(served, client):
    chat(client, DOCS[::-1], question="Which river reaches the Black Sea?", tenant="compression")
    ssd = Path(served.config["data_dir"]) / "kv"

    def entries() -> list[Path]:
        return [path for path in ssd.rglob("*") if path.is_file() and is_chunk_key(path.name)]

    deadline_s = time.monotonic() + 30
    while not entries() and time.monotonic() < deadline_s:  # the write-back runs in the background
        time.sleep(0.5)
    headers = {read_header(owned_blob(path.read_bytes())).compression for path in entries()}
    assert headers == {"int8"}  # passed: every chunk on the SSD is int8
    # int4 was refused for the RAM tier: its chunks stay uncompressed, counted, and the metric names it.
    assert metric(served.base_url, "blendserve_kv_codec_refused", codec="int4", tier="ram") >= 1
    assert metric(served.base_url, "blendserve_kv_codec_refused", codec="int8", tier="ssd") == 0
