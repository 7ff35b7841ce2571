"""The fallback-signal report: coverage joined with the frontier's rows, correlations and threshold groups."""
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.fallback_signal import signal_report
from workers.evaluation.evaluate import RecordScore


def _row(record: str, label: str, agreement: float, tf_kl: float) -> dict:
    mode = label.split("@")[0]
    return asdict(RecordScore(record, label, mode, 0.15, "a", 0.0, agreement, 0.0, 1.0, 0.1, tf_kl, 0.1, 0.5, 0.2, 100))


def test_coverage_is_joined_with_the_rows_and_split_at_each_threshold(tmp_path: Path) -> None:
    coverages = {"r0": 0.40, "r1": 0.55, "r2": 0.65, "r3": 0.80, "missing": 0.9}
    rows = []
    for i, (agreement, kl) in enumerate([(0.2, 0.08), (0.5, 0.06), (0.7, 0.04), (1.0, 0.02)]):
        rows += [_row(f"r{i}", "cacheblend@0.15", agreement, kl), _row(f"r{i}", "full_reuse", 0.1, 0.1)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = signal_report(coverages, path, 0.15)
    assert report["records"] == 4  # "missing" has no rows
    assert report["spearman"]["agreement_f1"] == pytest.approx(1.0)
    assert report["spearman"]["tf_kl"] == pytest.approx(-1.0)
    assert report["spearman"]["kl_left"] == pytest.approx(-1.0)
    split = report["by_threshold"]["0.500"]["agreement_f1"]
    assert split["below"]["n"] == 1 and split["below"]["mean"] == pytest.approx(0.2)
    assert split["at_or_above"]["n"] == 3 and split["at_or_above"]["mean"] == pytest.approx(0.7333, abs=1e-4)
    assert report["by_threshold"]["0.500"]["kl_left"]["below"]["mean"] == pytest.approx(0.8)
