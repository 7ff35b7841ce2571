"""Paired comparisons between two runs of bench/variant_payoff.py's output, over its requests (or one fit bucket).

For each pair A:B of run names: each metric's mean difference A - B over the requests with its 95% paired
bootstrap interval, and both runs' TTFT medians; --fit keeps only the requests of the given fit buckets
(`none`, `partial`, `exact`: whether and how well a variant was served).
"""
import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from workers.evaluation.bootstrap import paired_difference_interval

METRICS = ("recomputed_fraction", "tf_kl", "agreement_f1", "ttft_s")


def paired_report(rows: list[dict[str, Any]], first: str, second: str) -> dict[str, Any]:
    """A - B per metric over the rows, and both runs' TTFT medians."""
    if not rows:
        raise ValueError("no request to compare")
    report: dict[str, Any] = {"pair": f"{first} - {second}", "requests": len(rows)}
    for metric in METRICS:
        x, y = [row[first][metric] for row in rows], [row[second][metric] for row in rows]
        report[metric] = {"difference": statistics.fmean(x) - statistics.fmean(y),
                          "ci95": list(paired_difference_interval(x, y))}
    report["ttft_s_median"] = {run: statistics.median(row[run]["ttft_s"] for row in rows) for run in (first, second)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--result", type=Path, required=True, help="bench/variant_payoff.py's --out")
    parser.add_argument("--pairs", nargs="+", required=True, help="RUN_A:RUN_B, e.g. variants:cacheblend")
    parser.add_argument("--fit", nargs="*", default=[], help="only requests of these fit buckets (default: all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = [row for row in json.loads(args.result.read_text())["rows"] if not args.fit or row["fit"] in args.fit]
    reports = [paired_report(rows, *pair.split(":", 1)) for pair in args.pairs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"result": str(args.result), "fit": args.fit, "pairs": reports}, indent=1) + "\n")
    for report in reports:
        figures = ", ".join(
            f"{m} {report[m]['difference']:+.3f} [{report[m]['ci95'][0]:+.3f}, {report[m]['ci95'][1]:+.3f}]"
            for m in METRICS
        )
        print(f"{report['pair']} ({report['requests']} requests): {figures}")


if __name__ == "__main__":
    main()
