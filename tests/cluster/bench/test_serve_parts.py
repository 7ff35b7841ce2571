"""The serving benchmark's pure parts: workload files, load plans, summaries, and how each system is configured."""
import math
from pathlib import Path

import pytest

from cluster.bench.client import Outcome
from cluster.bench.metrics import agreement, gold_f1, percentiles, reuse_timeline, summarize, throughput_at_p95
from cluster.bench.serve import BenchPlan, LoadPoint
from cluster.bench.systems import EngineShape, blendserve_config, vllm_command
from cluster.bench.workload import (
    WorkloadRequest,
    distinct_documents,
    document_id,
    read_workload,
    write_workload,
)

SHAPE = EngineShape(Path("/models/m"), "m", "bfloat16", max_model_len=4096, kv_cache_bytes=1 << 30, max_num_seqs=4)


def _outcome(rid: str, ttft_s: float, *, ok: bool = True, sent_s: float = 0.0, blend: dict | None = None) -> Outcome:
    return Outcome(rid, sent_s=sent_s, ok=ok, ttft_s=ttft_s, itl_s=[0.03, 0.05], latency_s=ttft_s + 0.08,
                   prompt_tokens=100, output_tokens=3, text=f"answer {rid}", blend=blend, error="" if ok else "boom")


def test_a_workload_file_round_trips_and_lists_each_document_once(tmp_path: Path) -> None:
    requests = [WorkloadRequest("a", "q?", ("d1", "d2"), ("x",)), WorkloadRequest("b", "r?", ("d2", "d3"))]
    assert write_workload(tmp_path / "w.jsonl", requests) == 2
    assert read_workload(tmp_path / "w.jsonl") == requests
    assert read_workload(tmp_path / "w.jsonl", limit=1, offset=1) == requests[1:]
    assert distinct_documents(requests) == ["d1", "d2", "d3"]


@pytest.mark.parametrize("bad", [("", "q", ("d",)), ("a", " ", ("d",)), ("a", "q", ("d", " "))])
def test_a_request_without_id_question_or_with_an_empty_document_is_refused(bad: tuple) -> None:
    with pytest.raises(ValueError):
        WorkloadRequest(*bad)


def test_percentiles_are_within_the_sketch_accuracy() -> None:
    values = [i / 1000 for i in range(1, 1001)]
    summary = percentiles(values)
    assert summary["count"] == 1000
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        assert summary[name] == pytest.approx(q, rel=0.02)
    assert percentiles([]) == {"count": 0}


def test_summary_counts_reuse_per_tier_and_leaves_failures_out_of_latencies() -> None:
    outcomes = [
        _outcome("a", 1.0, blend={"ttft_s": 0.9, "reused_tokens": {}, "recomputed_tokens": 100}),
        _outcome("b", 0.2, blend={"ttft_s": 0.1, "reused_tokens": {"device": 60, "ram": 20}, "recomputed_tokens": 30}),
        _outcome("c", 50.0, ok=False),
    ]
    summary = summarize(outcomes, duration_s=4.0)
    assert summary["num_ok"] == 2 and summary["throughput_req_s"] == 0.5
    assert summary["ttft_s"]["count"] == 2 and summary["ttft_s"]["p99"] < 1.1
    assert summary["reused_tokens"] == {"device": 60, "ram": 20}
    assert summary["reused_fraction"] == 0.4 and summary["recompute_fraction"] == 0.65
    assert summary["errors"] == ["boom"]
    assert summary["http_s"]["p50"] == pytest.approx(0.1, rel=0.02) and summary["http_s"]["count"] == 2
    plain = summarize([_outcome("a", 1.0)], duration_s=1.0)
    assert plain["recompute_fraction"] is None and plain["reused_tokens"] == {}


def test_stage_medians_are_taken_per_plan() -> None:
    def blend(plan: str, lookup_s: float) -> dict:
        return {"ttft_s": 0.5, "plan": plan, "stages_s": {"lookup": lookup_s, "first_token": 0.3}}

    outcomes = [_outcome(rid, 0.6, blend=blend("blend", s)) for rid, s in (("a", 0.1), ("b", 0.3), ("c", 0.2))]
    outcomes.append(_outcome("d", 0.4, blend={"ttft_s": 0.3, "plan": "plain", "stages_s": {"first_token": 0.3}}))
    summary = summarize(outcomes, duration_s=2.0)
    assert summary["stages_s"] == {
        "blend": {"count": 3, "first_token": 0.3, "lookup": 0.2},
        "plain": {"count": 1, "first_token": 0.3},
    }
    assert summary["http_fraction"]["p50"] == pytest.approx(1 / 6, rel=0.02)


def test_agreement_compares_answers_to_the_same_request_only() -> None:
    result = agreement({"a": "Paris", "b": "the big river", "z": "x"}, {"a": "Paris", "b": "a river"})
    assert result == {"count": 2, "f1_mean": pytest.approx(0.8333, abs=1e-4), "identical": 0.5}
    assert agreement({"a": "x"}, {}) == {"count": 0}
    assert gold_f1({"a": "Paris", "b": "Rome"}, {"a": ["Paris"], "b": []}) == 1.0


def test_reuse_timeline_buckets_reuse_by_send_time() -> None:
    outcomes = [
        _outcome("a", 1.0, sent_s=1.0, blend={"reused_tokens": {}}),
        _outcome("b", 1.0, sent_s=12.0, blend={"reused_tokens": {"device": 70}}),
        _outcome("c", 1.0, sent_s=13.0, blend={"reused_tokens": {"remote": 10}}),
    ]
    assert reuse_timeline(outcomes, 10.0) == [
        {"start_s": 0.0, "prompt": 100}, {"start_s": 10.0, "device": 70, "remote": 10, "prompt": 200}
    ]


def test_each_load_point_gets_its_own_slice_of_the_workload() -> None:
    requests = tuple(WorkloadRequest(f"r{i}", "q?", ("d",)) for i in range(7))
    plan = BenchPlan(
        requests=requests, points=(LoadPoint(1.0), LoadPoint(2.0), LoadPoint(4.0)), shape=SHAPE, work_dir=Path("/tmp/x")
    )
    slices = [plan.point_requests(i) for i in range(3)]
    assert [len(s) for s in slices] == [2, 2, 2] and slices[1][0].id == "r2"
    with pytest.raises(ValueError, match="systems"):
        BenchPlan(requests=requests, points=(LoadPoint(),), shape=SHAPE, work_dir=Path("/tmp/x"), systems=("sglang",))
    with pytest.raises(ValueError):
        LoadPoint(rate_rps=0.0)
    assert LoadPoint(math.inf, 4).to_json() == {"rate_rps": None, "concurrency": 4}


def test_both_systems_get_the_same_engine_shape() -> None:
    config = blendserve_config(
        SHAPE, 8123, Path("/tmp/d"), {"admission": {"max_queued_per_worker": 8}, "data_dir": "/x"}
    )
    vllm = config["engine"]["vllm"]
    assert config["engine"]["kind"] == "vllm" and config["model"]["dtype"] == "bfloat16"
    assert (vllm["kv_cache_bytes"], vllm["max_num_seqs"], vllm["max_model_len"]) == (1 << 30, 4, 4096)
    assert config["server"] == {"host": "127.0.0.1", "port": 8123}
    assert config["admission"] == {"max_queued_per_worker": 8} and config["data_dir"] == "/x"  # the caller's own wins
    command = vllm_command(SHAPE, 8124)
    for flag, value in (
        ("--dtype", "bfloat16"),
        ("--kv-cache-memory-bytes", str(1 << 30)),
        ("--max-num-seqs", "4"),
        ("--max-model-len", "4096"),
        ("--port", "8124"),
    ):
        assert command[command.index(flag) + 1] == value
    assert "--enable-prefix-caching" in command and "--enforce-eager" in command


def test_an_engine_shape_needs_a_concrete_dtype() -> None:
    with pytest.raises(ValueError, match="concrete"):
        EngineShape(Path("/m"), "m", "auto")


def test_throughput_at_a_p95_budget_interpolates_between_load_points() -> None:
    points = [(0.5, 1.0), (1.0, 2.0), (1.2, 10.0)]
    assert throughput_at_p95(points, 2.0) == 1.0
    assert throughput_at_p95(points, 6.0) == pytest.approx(1.1)
    assert throughput_at_p95(points, 100.0) == 1.2
    assert throughput_at_p95(points, 0.5) == 0.0


def test_a_document_id_is_url_safe_and_names_the_text() -> None:
    first, again, other = document_id("The Danube"), document_id("The Danube"), document_id("The Danube.")
    assert first == again != other
    assert first.startswith("w-") and first[2:].isalnum() and len(first) == 26
