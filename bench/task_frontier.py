"""The task suite's frontier: accuracy relative to full prefill (95% paired bootstrap interval) against TTFT.

Reads `blendserve eval` results of task files (bench/tasks.py), one per family or setting, and plots every
labelled run of each as a point with its interval.

    .venv/bin/python bench/task_frontier.py docs/results/tasks/chain_k5_t1000.json ... \\
        --out docs/results/tasks/frontier.png
"""
import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen


def frontier_points(result: dict) -> list[dict]:
    """(label, TTFT median, relative accuracy and its interval) of each run of one eval result that has them."""
    points = []
    for label, row in result["modes"].items():
        if "relative_accuracy" in row:
            low, high = row["relative_accuracy_ci95"]
            points.append({"label": label, "ttft_s_median": row["ttft_s_median"], "relative_accuracy":
                           row["relative_accuracy"], "low": low, "high": high, "records": row["records"]})
    return points


def main() -> None:
    """Parse arguments, read the results, write the plot and its points."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="blendserve eval result files (--out)")
    parser.add_argument("--out", type=Path, required=True, help="the plot (PNG); its points go beside it as JSON")
    args = parser.parse_args()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    everything = {}
    for path in args.results:
        points = frontier_points(json.loads(path.read_text()))
        everything[path.stem] = points
        xs = [p["ttft_s_median"] for p in points]
        ys = [p["relative_accuracy"] for p in points]
        errors = [[y - p["low"] for y, p in zip(ys, points)], [p["high"] - y for y, p in zip(ys, points)]]
        axes.errorbar(xs, ys, yerr=errors, fmt="o", capsize=3, label=path.stem)
        for x, y, p in zip(xs, ys, points):
            axes.annotate(p["label"], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xlabel("TTFT median (s)")
    axes.set_ylabel("accuracy relative to full prefill")
    axes.legend(fontsize=7)
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120)
    args.out.with_suffix(".json").write_text(json.dumps(everything, indent=2) + "\n")


if __name__ == "__main__":
    main()
