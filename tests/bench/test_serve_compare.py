"""Comparing blendserve runs of one workload: paired TTFT ratio, tier shares, answers against the first run."""
import json
from pathlib import Path

import pytest

from bench.serve_compare import median_ratio, reference_difference, requests_of, summarize_run


def _request(rid: str, ttft_s: float, reused: dict[str, int], text: str = "Paris", ok: bool = True) -> dict:
    return {"id": rid, "ok": ok, "ttft_s": ttft_s, "text": text, "prompt_tokens": 100,
            "blend": {"ttft_s": ttft_s - 0.1, "reused_tokens": reused, "plan": "blend"}}


def test_a_run_is_summarized_by_its_answered_requests(tmp_path: Path) -> None:
    requests = [_request("a", 1.0, {"device": 60}), _request("b", 3.0, {"ssd": 90}),
                _request("c", 9.0, {}, ok=False)]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"systems": {"blendserve": {"points": [{"requests": requests}]}}}))
    answered = requests_of(path)
    summary = summarize_run(answered)
    assert [r["id"] for r in answered] == ["a", "b"]
    assert summary["ttft_p50_s"] == 2.0 and summary["worker_ttft_p50_s"] == 1.9
    assert summary["tier_share"] == {"device": 0.3, "ssd": 0.45} and summary["plans"] == ["blend"]


def test_the_ttft_ratio_pairs_requests_by_id() -> None:
    base = {"a": 2.0, "b": 4.0, "c": 6.0, "only-in-base": 100.0}
    faster = {"a": 1.0, "b": 2.0, "c": 3.0}
    ratio = median_ratio(base, faster)
    assert ratio["count"] == 3 and ratio["ratio"] == pytest.approx(2.0)
    assert ratio["low"] == pytest.approx(2.0) and ratio["high"] == pytest.approx(2.0)  # every pair halves


def test_agreement_with_a_reference_system_is_compared_in_pairs(tmp_path: Path) -> None:
    reference = {"a": "Paris", "b": "in 1889", "c": "the Danube"}
    base = {"a": "Paris", "b": "in 1889", "c": "the Rhine", "d": "unpaired"}
    other = {"a": "Paris", "b": "in 1889", "c": "the Danube"}
    difference = reference_difference(base, other, reference)
    assert difference["count"] == 3
    # "the Rhine" shares no token with "the Danube" once articles are dropped (SQuAD's normalisation): F1 0
    assert difference["difference"] == pytest.approx(1 / 3, abs=1e-4)
    assert difference["low"] == 0.0 and difference["high"] == pytest.approx(1.0)
    assert reference_difference(base, {}, reference) == {"count": 0}
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"systems": {"vllm": {"points": [{"requests": [_request("a", 1.0, {})]}]}}}))
    assert [r["id"] for r in requests_of(path, "vllm")] == ["a"]
