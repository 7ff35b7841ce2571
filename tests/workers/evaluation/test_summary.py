"""Summaries over record scores: accuracy relative to full prefill, and which records a resumed run still owes."""
from dataclasses import replace

from workers.evaluation.dataset import QARecord
from workers.evaluation.evaluate import EvalRun, RecordScore, pending_records, summarise

ROW = RecordScore("r0", "full_prefill", "full_prefill", 1.0, "x", 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 100,
                  accuracy=1.0)


def _rows(label: str, mode: str, accuracies: list[float]) -> list[RecordScore]:
    return [replace(ROW, record=f"r{i}", label=label, mode=mode, accuracy=a) for i, a in enumerate(accuracies)]


def test_relative_accuracy_pairs_each_record_with_full_prefills() -> None:
    scores = _rows("full_prefill", "full_prefill", [1, 1, 1, 1, 0] * 20) + _rows("cacheblend", "cacheblend",
                                                                                  [1, 1, 1, 0, 0] * 20)
    runs = [EvalRun("full_prefill", "full_prefill", 1.0), EvalRun("cacheblend", "cacheblend", 0.15)]
    summary = summarise(scores, runs)
    assert summary["full_prefill"]["relative_accuracy"] == 1.0
    relative = summary["cacheblend"]
    assert relative["relative_accuracy"] == 0.75  # 60 correct against full prefill's 80
    low, high = relative["relative_accuracy_ci95"]
    assert low < 0.75 < high < 1.0


def test_no_relative_accuracy_without_a_correct_full_prefill_answer() -> None:
    scores = _rows("full_prefill", "full_prefill", [0, 0]) + _rows("full_reuse", "full_reuse", [1, 0])
    assert "relative_accuracy" not in summarise(scores)["full_reuse"]


def test_a_resumed_run_owes_the_records_missing_any_label() -> None:
    records = [QARecord(f"r{i}", "q?", ["a"], ["d"]) for i in range(3)]
    done = _rows("full_prefill", "full_prefill", [1, 1]) + _rows("cacheblend", "cacheblend", [1])
    assert [r.id for r in pending_records(records, done, ["full_prefill", "cacheblend"])] == ["r1", "r2"]
    assert pending_records(records, done, ["full_prefill"]) == records[2:]
