"""Paired frontier comparisons: differences over the records both runs share."""
from dataclasses import replace

import pytest

from bench.frontier_pairs import paired_report
from workers.evaluation.evaluate import RecordScore


def _row(record: str, label: str, agreement: float, ttft_s: float) -> RecordScore:
    return RecordScore(record, label, label.split("@")[0], 0.15, "a", 0.0, agreement, 0.0, 1.0, 0.1, 0.05, 0.1,
                       ttft_s, 0.2, 100)


def test_differences_cover_only_the_records_both_ran_on() -> None:
    rows = [_row("r0", "a@0.1", 0.9, 1.0), _row("r0", "b@0.2", 0.5, 2.0),
            _row("r1", "a@0.1", 0.7, 3.0), _row("r1", "b@0.2", 0.7, 1.0), _row("r2", "a@0.1", 0.0, 9.0)]
    report = paired_report(rows, "a@0.1", "b@0.2")
    assert report["records"] == 2
    assert report["agreement_f1"]["difference"] == pytest.approx(0.2)
    assert report["ttft_s"]["difference"] == pytest.approx(0.5)
    assert report["ttft_s_median"] == {"a@0.1": 2.0, "b@0.2": 1.5}
    lo, hi = report["agreement_f1"]["ci95"]
    assert 0.0 <= lo <= 0.2 <= hi <= 0.4 + 1e-9  # the two records' differences are 0.4 and 0.0
    with pytest.raises(ValueError, match="no record"):
        paired_report(rows, "a@0.1", "c@0.3")


def test_the_second_label_may_come_from_another_models_rows() -> None:
    mine = [_row("r0", "cb@0.15", 0.9, 1.0), _row("r1", "cb@0.15", 0.5, 1.0)]
    other = [_row("r1", "cb@0.15", 0.2, 2.0), _row("r2", "cb@0.15", 0.0, 2.0)]
    report = paired_report(mine, "cb@0.15", "cb@0.15", other)
    assert report["records"] == 1 and report["agreement_f1"]["difference"] == pytest.approx(0.3)
    assert paired_report(mine, "cb@0.15", "cb@0.15")["agreement_f1"]["difference"] == 0.0


def test_a_metric_one_run_did_not_measure_is_left_out() -> None:
    mine = [_row("r0", "cb", 0.9, 1.0), replace(_row("r1", "cb", 0.5, 1.0), tf_kl=None)]
    other = [_row("r0", "cb", 0.7, 2.0), _row("r1", "cb", 0.5, 2.0)]
    report = paired_report(mine, "cb", "cb", other)
    assert "tf_kl" not in report and report["agreement_f1"]["difference"] == pytest.approx(0.1)
