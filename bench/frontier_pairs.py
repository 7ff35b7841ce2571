"""Paired comparisons between two frontier runs on the same records (e.g. two modes at about the same TTFT).

For each pair A:B of labels in the frontier's rows (bench/frontier.py), over the records that have both: each
metric's mean difference A - B with its 95% paired bootstrap interval, and both runs' TTFT medians. With
--second-rows, B is read from another frontier's rows (another model on the same records).
"""
import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from workers.evaluation.bootstrap import paired_difference_interval
from workers.evaluation.evaluate import RecordScore, read_rows

METRICS = ("accuracy", "agreement_f1", "exact_match", "first_token_agreement", "tf_kl", "ttft_s", "recomputed_fraction")


def paired_report(
    rows: list[RecordScore], first: str, second: str, second_rows: list[RecordScore] | None = None
) -> dict[str, Any]:
    """A - B per metric over the records both labels ran on; B from `second_rows` when given (another model)."""
    a, b = _by_record(rows, first), _by_record(rows if second_rows is None else second_rows, second)
    records = [record for record in a if record in b]
    if not records:
        raise ValueError(f"no record has both {first!r} and {second!r}")
    report: dict[str, Any] = {"pair": f"{first} - {second}", "records": len(records)}
    for metric in METRICS:
        x = [getattr(a[r], metric) for r in records]
        y = [getattr(b[r], metric) for r in records]
        if None in x or None in y:  # a run without teacher-forced figures (--no-teacher-forced)
            continue
        report[metric] = {"difference": statistics.fmean(x) - statistics.fmean(y),
                          "ci95": list(paired_difference_interval(x, y))}
    report["ttft_s_median"] = {first: statistics.median(a[r].ttft_s for r in records),
                               second: statistics.median(b[r].ttft_s for r in records)}
    return report


def _by_record(rows: list[RecordScore], label: str) -> dict[str, RecordScore]:
    return {row.record: row for row in rows if row.label == label}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=Path, required=True)
    parser.add_argument("--pairs", nargs="+", required=True,
                        help="LABEL_A:LABEL_B, e.g. query_driven@0.05:cacheblend@0.15")
    parser.add_argument("--second-rows", type=Path,
                        help="read each pair's LABEL_B from these rows (another model on the same records)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = read_rows(args.rows)
    second_rows = read_rows(args.second_rows) if args.second_rows is not None else None
    reports = [paired_report(rows, *pair.split(":", 1), second_rows) for pair in args.pairs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"rows": str(args.rows), "second_rows": str(args.second_rows or args.rows), "pairs": reports}
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    for report in reports:
        figures = ", ".join(_difference(m, report[m]) for m in METRICS if m in report)
        print(f"{report['pair']} ({report['records']} records): {figures}")


def _difference(metric: str, entry: dict[str, Any]) -> str:
    low, high = entry["ci95"]
    return f"{metric} {entry['difference']:+.3f} [{low:+.3f}, {high:+.3f}]"


if __name__ == "__main__":
    main()
