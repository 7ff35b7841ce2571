"""Plots of the serving benchmark for docs/benchmarks.md, from the result JSON files.

python bench/serve_plots.py --replay docs/results/serve/serve_replay.json --reuse docs/results/serve/serve_2wiki.json \
    --multinode docs/results/multinode/serve_multinode.json --simulation docs/results/multinode/serve_simulation.json \
    --out-dir docs
"""
import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

from cluster.bench.metrics import throughput_at_p95

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter  # noqa: E402

# "shard" is what runs recorded before the shard reads were labelled by node: the node's or another's.
TIERS = ("device", "ram", "ssd", "shard", "remote", "object")
TIER_LABELS = {"shard": "shard (local or remote)"}
POLICY_LABELS = {"affinity": "cache affinity", "power_of_two": "power of two", "round_robin": "round robin"}


def _label(result: dict[str, Any]) -> str:
    machine = result["machine"]
    return f"{machine['hardware']}, {machine['dtype']}"


def _decorate(axis: Any, xlabel: str, ylabel: str, title: str, legend_loc: str = "best") -> None:
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc=legend_loc)


def _plain_log_ticks(axis: Any) -> None:
    """Ticks of a log axis at 1, 2, 5 x 10^k labelled as plain numbers, the minor ticks unlabelled."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FormatStrFormatter("%g"))
    axis.set_minor_formatter(NullFormatter())


def _save(figure: Any, out: Path) -> None:
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    plt.close(figure)


def _load_label(load: dict[str, Any]) -> str:
    return f"{load['rate_rps']:g}/s" if load["rate_rps"] else f"concurrency {load['concurrency']}"


def _system_label(name: str) -> str:
    return "blendserve" if name == "blendserve" else "plain vLLM (prefix caching)"


def ttft_cdf(results: Sequence[tuple[str, dict[str, Any]]], out: Path) -> None:
    """TTFT CDF per system, one panel per run."""
    figure, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for axis, (title, result) in zip(axes[0], results):
        for name, system in result["systems"].items():
            ttfts = sorted(r["ttft_s"] for p in system["points"] for r in p["requests"] if r["ok"])
            axis.step(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], where="post", label=_system_label(name))
        axis.set_xscale("log")
        _plain_log_ticks(axis.xaxis)
        _decorate(axis, "TTFT through HTTP (s)", "share of requests", f"{title}\n{_label(result)}", "upper left")
    _save(figure, out)


def throughput_vs_p95(result: dict[str, Any], out: Path) -> None:
    """Achieved throughput against p95 TTFT at each offered rate, per system."""
    figure, axis = plt.subplots(figsize=(6, 4))
    for name, system in result["systems"].items():
        points = [(p["summary"]["throughput_req_s"], p["summary"]["ttft_s"]["p95"], _load_label(p["load"]))
                  for p in system["points"] if p["summary"]["ttft_s"].get("count")]
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=_system_label(name))
        for throughput, p95, rate in points:
            axis.annotate(rate, (throughput, p95), fontsize=7, textcoords="offset points", xytext=(4, 4))
    axis.set_yscale("log")
    _plain_log_ticks(axis.yaxis)
    _decorate(axis, "throughput (requests/s)", "p95 TTFT (s)",
              f"2wiki reuse workload, offered rate annotated\n{_label(result)}", "lower right")
    _save(figure, out)


def _window_s(windows: list[dict[str, Any]]) -> float:
    return windows[1]["start_s"] - windows[0]["start_s"] if len(windows) > 1 else 10.0


def _in_turn(points: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[float, str]]]:
    """The load points' windows on one time axis, each point after the last, and where each point starts."""
    windows: list[dict[str, Any]] = []
    marks: list[tuple[float, str]] = []
    offset_s = 0.0
    for point in points:
        timeline = point["timeline"]
        if not timeline:
            continue
        marks.append((offset_s, _load_label(point["load"])))
        windows += [{**w, "start_s": w["start_s"] + offset_s} for w in timeline]
        offset_s += timeline[-1]["start_s"] + _window_s(timeline)
    return windows, marks


def reuse_over_time(result: dict[str, Any], multinode: dict[str, Any] | None, out: Path) -> None:
    """Share of prompt tokens reused per tier in each time window of the run, stacked by tier."""
    windows, marks = _in_turn(result["systems"]["blendserve"]["points"])
    panels: list[tuple[str, list[dict[str, Any]], list[tuple[float, str]]]] = [
        ("blendserve, 2wiki reuse workload (the load points in turn)", windows, marks),
    ]
    if multinode:
        for run in multinode["runs"]:
            if run["nodes"] == max(r["nodes"] for r in multinode["runs"]):
                panels.append((f"{run['nodes']} nodes, {POLICY_LABELS[run['policy']]}", run["timeline"], []))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for axis, (title, windows, marks) in zip(axes[0], panels):
        starts = [w["start_s"] for w in windows]
        bottoms = [0.0] * len(windows)
        for index, tier in enumerate(TIERS):
            shares = [w.get(tier, 0) / w["prompt"] if w.get("prompt") else 0.0 for w in windows]
            if any(shares):
                axis.bar(starts, shares, width=_window_s(windows) * 0.9, align="edge", bottom=bottoms,
                         label=TIER_LABELS.get(tier, tier), color=f"C{index}")
                bottoms = [b + s for b, s in zip(bottoms, shares)]
        for start_s, label in marks:
            axis.axvline(start_s, color="gray", linewidth=0.8, linestyle=":")
            axis.text(start_s + 1, 1.02, label, fontsize=7)
        axis.set_ylim(0, 1.3)
        _decorate(axis, "requests sent in the window starting at (s)", "share of prompt tokens reused", title,
                  "upper right")
    _save(figure, out)


def hit_rate_vs_nodes(simulation: dict[str, Any], multinode: dict[str, Any], out: Path) -> None:
    """Device-tier hit rate vs nodes (the tier measured runs label exactly): projected lines, measured points."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for policy, label in POLICY_LABELS.items():
        rows = [r for r in simulation["by_nodes"] if r["policy"] == policy]
        line = left.plot([r["nodes"] for r in rows], [r["device_hit_rate"] for r in rows], marker=".", label=label)
        measured = [r for r in multinode["runs"] if r["policy"] == policy]
        left.scatter([r["nodes"] for r in measured], [r["hit_rate"]["device"] for r in measured], marker="x", s=60,
                     color=line[0].get_color())
        right.plot([r["nodes"] for r in rows], [r["ttft_p95_s"] for r in rows], marker=".", label=label,
                   color=line[0].get_color())
        right.scatter([r["nodes"] for r in measured], [r["ttft_s"]["p95"] for r in measured], marker="x", s=60,
                      color=line[0].get_color())
        checks = [c for c in simulation["check"] if c["policy"] == policy]
        for axis, figure_of in ((left, "device_hit_rate"), (right, "ttft_p95_s")):
            axis.scatter([c["nodes"] for c in checks], [c["simulated"][figure_of] for c in checks], marker="o", s=50,
                         facecolors="none", edgecolors=line[0].get_color())
    machine = f"{simulation['machine']['hardware']}, {simulation['machine']['dtype']}"
    for axis, ylabel, title in (
        (
            left,
            "hit rate of the device tier",
            f"projected (lines), measured (x), simulated on the measured arrivals (o)\n{machine}",
        ),
        (right, "p95 TTFT (s)", "the same runs: p95 TTFT"),
    ):
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        _decorate(axis, "nodes (one worker and one shard each)", ylabel, title)
    _save(figure, out)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def tables(replay: dict[str, Any], reuse: dict[str, Any], multinode: dict[str, Any] | None) -> str:
    """Markdown tables of the runs (what docs/benchmarks.md quotes)."""
    lines = []
    for title, result in (("replay", replay), ("2wiki reuse", reuse)):
        lines += [
            f"### {title} ({_label(result)})",
            "",
            "| system | load | ok | TTFT p50 | TTFT p90 | TTFT p95 | ITL p50 | e2e p50 | req/s | reused | recomputed |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, system in result["systems"].items():
            for point in system["points"]:
                s, where = point["summary"], _load_label(point["load"])
                lines.append(
                    f"| {name} | {where} | {s['num_ok']}/{s['num_requests']} | {_fmt(s['ttft_s'].get('p50'))} | "
                    f"{_fmt(s['ttft_s'].get('p90'))} | {_fmt(s['ttft_s'].get('p95'))} | "
                    f"{_fmt(s['itl_s'].get('p50'), 4)} | "
                    f"{_fmt(s['e2e_s'].get('p50'))} | {_fmt(s['throughput_req_s'])} | {s['reused_fraction']} | "
                    f"{s['recompute_fraction']} |"
                )
        lines += [
            "",
            "| load | TTFT p50 ratio | TTFT p95 ratio | throughput ratio | agreement F1 | identical "
            "| gold F1 (ours / vLLM) |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in result["comparison"]:
            where = _load_label(row)
            agree = row["agreement_with_vllm"]
            lines.append(
                f"| {where} | {row['ttft_median_ratio']} | {row['ttft_p95_ratio']} | {row['throughput_ratio']} | "
                f"{agree.get('f1_mean')} | {agree.get('identical')} | {row['gold_f1']['blendserve']} / "
                f"{row['gold_f1']['vllm']} |"
            )
        lines.append("")
    points = {
        name: [
            (p["summary"]["throughput_req_s"], p["summary"]["ttft_s"]["p95"])
            for p in system["points"]
            if p["summary"]["ttft_s"].get("count")
        ]
        for name, system in reuse["systems"].items()
    }
    if {"blendserve", "vllm"} <= points.keys():
        lines += [
            "| p95 budget (plain vLLM's p95 at a load point) | plain vLLM req/s | blendserve req/s | ratio |",
            "|---|---|---|---|",
        ]
        for p95 in sorted({p95 for _, p95 in points["vllm"]}):
            theirs, ours = throughput_at_p95(points["vllm"], p95), throughput_at_p95(points["blendserve"], p95)
            lines.append(f"| {p95:.3f} s | {theirs:.3f} | {ours:.3f} | {ours / theirs if theirs else 0:.2f} |")
        lines.append("")
    if multinode:
        lines += [
            "| nodes | policy | device | shard (local or remote) | object | miss | device + shard | "
            "TTFT p50 | TTFT p95 | req/s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for run in sorted(multinode["runs"], key=lambda r: (r["nodes"], r["policy"])):
            h = run["hit_rate"]
            shard = h["ram"] + h["ssd"] + h.get("shard", 0.0) + h["remote"]
            lines.append(
                f"| {run['nodes']} | {run['policy']} | {h['device']} | {shard:.4f} | {h['object']} | "
                f"{h['miss']} | {h['device'] + shard:.4f} | "
                f"{_fmt(run['ttft_s'].get('p50'))} | {_fmt(run['ttft_s'].get('p95'))} | {run['throughput_req_s']} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replay", type=Path, required=True)
    parser.add_argument("--reuse", type=Path, required=True)
    parser.add_argument("--multinode", type=Path)
    parser.add_argument("--simulation", type=Path)
    parser.add_argument("--out-dir", type=Path, default=Path("docs"))
    args = parser.parse_args(argv)
    replay, reuse = (json.loads(p.read_text()) for p in (args.replay, args.reuse))
    multinode = json.loads(args.multinode.read_text()) if args.multinode else None
    ttft_cdf(
        [("replay, chunks cached, concurrency 1", replay), ("2wiki reuse workload, all rates", reuse)],
        args.out_dir / "serve_ttft_cdf.png",
    )
    throughput_vs_p95(reuse, args.out_dir / "serve_throughput_p95.png")
    reuse_over_time(reuse, multinode, args.out_dir / "serve_reuse_timeline.png")
    if multinode and args.simulation:
        hit_rate_vs_nodes(json.loads(args.simulation.read_text()), multinode, args.out_dir / "serve_hit_rate_nodes.png")
    print(tables(replay, reuse, multinode))


if __name__ == "__main__":
    main()
