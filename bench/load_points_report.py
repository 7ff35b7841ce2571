"""The load-point runs of `blendserve bench serve` summarised per workload: ratios, intervals, medians over runs.

Each run holds both systems at the same load points on the same requests. Per load point and run: plain vLLM's
TTFT p50 and p95 over blendserve's (above 1: blendserve faster) with a 95% interval of the p50 ratio (requests
resampled in pairs: the same request on both systems), and the throughput ratio; then the median over the
runs. Throughput at equal p95: the most requests/s each system reaches within plain vLLM's p95 at that point
(interpolated between its own load points), blendserve's over vLLM's. Writes a JSON summary, Markdown tables
and a plot.

    .venv/bin/python bench/load_points_report.py --run 2wiki=docs/results/load_points/2wiki_run1.json \
        --run 2wiki=docs/results/load_points/2wiki_run2.json --out docs/results/load_points/summary.json \
        --plot docs/serve_load_points.png
"""
import argparse
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import matplotlib

from cluster.bench.metrics import throughput_at_p95
from workers.evaluation.bootstrap import paired_median_ratio_interval

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)


def point_figures(result: dict[str, Any], index: int) -> dict[str, Any]:
    """One run's figures at load point `index`."""
    ours, theirs = (result["systems"][name]["points"][index] for name in ("blendserve", "vllm"))
    by_id = {r["id"]: r for r in ours["requests"] if r["ok"]}
    pairs = [(r["ttft_s"], by_id[r["id"]]["ttft_s"]) for r in theirs["requests"] if r["ok"] and r["id"] in by_id]
    low, high = paired_median_ratio_interval([p[0] for p in pairs], [p[1] for p in pairs])
    summary = {name: point["summary"] for name, point in (("blendserve", ours), ("vllm", theirs))}
    curves = {name: [(p["summary"]["throughput_req_s"], p["summary"]["ttft_s"]["p95"])
                     for p in result["systems"][name]["points"]] for name in ("blendserve", "vllm")}
    budget = summary["vllm"]["ttft_s"]["p95"]
    return {
        "load": ours["load"],
        "ttft_p50_s": {n: s["ttft_s"]["p50"] for n, s in summary.items()},
        "ttft_p95_s": {n: s["ttft_s"]["p95"] for n, s in summary.items()},
        "throughput_req_s": {n: s["throughput_req_s"] for n, s in summary.items()},
        "ttft_p50_ratio": summary["vllm"]["ttft_s"]["p50"] / summary["blendserve"]["ttft_s"]["p50"],
        "ttft_p50_ratio_ci95": [low, high],
        "ttft_p95_ratio": summary["vllm"]["ttft_s"]["p95"] / summary["blendserve"]["ttft_s"]["p95"],
        "throughput_ratio": summary["blendserve"]["throughput_req_s"] / summary["vllm"]["throughput_req_s"],
        # Both systems' best within the same p95: vLLM's own curve may reach more than this point does.
        "throughput_at_equal_p95_ratio": throughput_at_p95(curves["blendserve"], budget)
        / throughput_at_p95(curves["vllm"], budget),
        "num_errors": {n: s["num_requests"] - s["num_ok"] for n, s in summary.items()},
        "num_requests": summary["blendserve"]["num_requests"],
        # figures only the serving benchmark's summaries carry (runs written before them lack them)
        "itl_p50_s": {n: s.get("itl_s", {}).get("p50") for n, s in summary.items()},
        "http_p50_s": summary["blendserve"].get("http_s", {}).get("p50"),
        "plans": {plan: stages["count"] for plan, stages in summary["blendserve"].get("stages_s", {}).items()},
        "reused_tokens": summary["blendserve"].get("reused_tokens", {}),
        "prompt_tokens": summary["blendserve"].get("prompt_tokens", 0),
    }


def workload_summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per load point: every run's figures and the median of each ratio over the runs."""
    points = []
    for index in range(len(results[0]["plan"]["points"])):
        runs = [point_figures(result, index) for result in results]
        entry: dict[str, Any] = {"load": runs[0]["load"], "runs": runs}
        for key in ("ttft_p50_ratio", "ttft_p95_ratio", "throughput_ratio", "throughput_at_equal_p95_ratio"):
            entry[key] = statistics.median(run[key] for run in runs)
        entry["ttft_p50_ratio_ci95"] = [statistics.median(run["ttft_p50_ratio_ci95"][i] for run in runs)
                                        for i in (0, 1)]
        points.append(entry)
    return points


def plot(summaries: dict[str, list[dict[str, Any]]], machine: str, out: Path) -> None:
    """Throughput against p95 TTFT per workload, both systems, every run."""
    figure, axes = plt.subplots(1, len(summaries), figsize=(4.2 * len(summaries), 3.6), squeeze=False)
    for axis, (workload, points) in zip(axes[0], summaries.items()):
        for name, colour in (("blendserve", "tab:blue"), ("vllm", "tab:orange")):
            for run in range(len(points[0]["runs"])):
                xs = [p["runs"][run]["ttft_p95_s"][name] for p in points]
                ys = [p["runs"][run]["throughput_req_s"][name] for p in points]
                label = ("blendserve" if name == "blendserve" else "plain vLLM") if run == 0 else None
                axis.plot(xs, ys, "o-", color=colour, alpha=0.8, label=label)
        axis.set_xscale("log")
        axis.set_xlabel("TTFT p95 (s)")
        axis.set_ylabel("requests/s")
        axis.set_title(workload, fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"Load points (concurrency 1, 2, 4), {machine}", fontsize=9)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)


def table(summaries: dict[str, list[dict[str, Any]]]) -> str:
    """A Markdown table: one row per workload and load point."""
    lines = ["| workload | load | runs | TTFT p50 ratio [95% CI] | TTFT p95 ratio | throughput ratio | "
             "throughput at equal p95 | errors |", "|---|---|---|---|---|---|---|---|"]
    for workload, points in summaries.items():
        for p in points:
            concurrency = p["load"]["concurrency"]
            load = f"concurrency {concurrency}" if concurrency else f"{p['load']['rate_rps']}/s"
            low, high = p["ttft_p50_ratio_ci95"]
            errors = sum(sum(run["num_errors"].values()) for run in p["runs"])
            lines.append(f"| {workload} | {load} | {len(p['runs'])} | {p['ttft_p50_ratio']:.2f}x "
                         f"[{low:.2f}, {high:.2f}] | {p['ttft_p95_ratio']:.2f}x | {p['throughput_ratio']:.2f}x | "
                         f"{p['throughput_at_equal_p95_ratio']:.2f}x | {errors} |")
    return "\n".join(lines)


def _median_over(runs: list[dict[str, Any]], key: str, name: str | None = None) -> float:
    """The median over the runs of `run[key]` (of `run[key][name]` for a per-system figure)."""
    return statistics.median(run[key] if name is None else run[key][name] for run in runs)


def _detail_row(workload: str, point: dict[str, Any]) -> str:
    runs = point["runs"]
    prompt_tokens = sum(run["prompt_tokens"] for run in runs)
    reused = sum((Counter(run["reused_tokens"]) for run in runs), Counter())
    shares = ", ".join(f"{tier} {100 * tokens / prompt_tokens:.0f}%" for tier, tokens in reused.most_common())
    blend, plain = (sum(run["plans"].get(plan, 0) for run in runs) for plan in ("blend", "plain"))
    ours, theirs = (
        f"{_median_over(runs, 'ttft_p50_s', name):.2f} / {_median_over(runs, 'ttft_p95_s', name):.2f} s"
        for name in ("blendserve", "vllm")
    )
    itl = f"{_median_over(runs, 'itl_p50_s', 'blendserve'):.3f} / {_median_over(runs, 'itl_p50_s', 'vllm'):.3f} s"
    return (f"| {workload} | {point['load']['concurrency']} | {ours} | {theirs} | {itl} | "
            f"{_median_over(runs, 'http_p50_s'):.3f} s | {blend} / {plain} | {shares} |")


def details(summaries: dict[str, list[dict[str, Any]]]) -> str:
    """A Markdown table of each point's own figures: medians over the runs; plans and reused tokens summed."""
    lines = ["| workload | concurrency | blendserve TTFT p50 / p95 | plain vLLM TTFT p50 / p95 | ITL p50 (ours / vLLM) "
             "| HTTP path p50 | plans (blend / plain) | reused prompt tokens |", "|---|---|---|---|---|---|---|---|"]
    lines += [_detail_row(workload, point) for workload, points in summaries.items() for point in points]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, help="WORKLOAD=RESULT.json, once per run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    paths: dict[str, list[str]] = defaultdict(list)
    for item in args.run:
        workload, path = item.split("=", 1)
        runs[workload].append(json.loads(Path(path).read_text()))
        paths[workload].append(path)
    summaries = {workload: workload_summary(results) for workload, results in runs.items()}
    first = next(iter(runs.values()))[0]["machine"]
    machine = f"{first['cpu_model']}, {first['hardware']}, {first['dtype']}"
    document = {"machine": first, "runs": paths, "workloads": summaries}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    if args.plot is not None:
        plot(summaries, machine, args.plot)
    print(table(summaries))
    print()
    print(details(summaries))


if __name__ == "__main__":
    main()
