"""Draw a frontier result (bench/frontier.py --out) as agreement F1 against TTFT; also redraws a stored result.

python bench/frontier_plot.py docs/results/frontier/frontier_musique.json docs/frontier_musique.png
"""
import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
from matplotlib.lines import Line2D  # noqa: E402

REFERENCE_MODE = "full_prefill"
RATIO_FREE = {"full_reuse"}  # modes that recompute nothing whatever the ratio
TARGET_AGREEMENT = 0.90
# One colour per mode and one marker per ratio, the same in every plot, so that no point needs a text label
# (labels collide where the modes' curves cross).
MODE_COLOURS = {"full_reuse": "tab:blue", "epic": "tab:orange", "cacheblend": "tab:green",
                "cachecraft": "tab:red", "query_driven": "tab:purple"}
RATIO_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _ratio_marker(ratios: list[float], ratio: float) -> str:
    return RATIO_MARKERS[ratios.index(ratio) % len(RATIO_MARKERS)]


def plot(summary: dict[str, dict[str, Any]], title: str, path: Path) -> None:
    """Agreement F1 (95% interval bars) against TTFT median: a line per mode, a marker per ratio."""
    modes = list(dict.fromkeys(row["mode"] for row in summary.values() if row["mode"] != REFERENCE_MODE))
    ratios = sorted({row["ratio"] for row in summary.values()
                     if row["mode"] not in RATIO_FREE and row["mode"] != REFERENCE_MODE})
    fig, ax = plt.subplots(figsize=(8, 5.2))
    for index, mode in enumerate(modes):
        rows = sorted((r for r in summary.values() if r["mode"] == mode), key=lambda r: r["ratio"])
        colour = MODE_COLOURS.get(mode, f"C{index}")
        ttft = [r["ttft_s_median"] for r in rows]
        mean = [r["agreement_f1"] for r in rows]
        ax.plot(ttft, mean, color=colour, linewidth=1.5, alpha=0.8)
        for x, y, row in zip(ttft, mean, rows):
            low, high = row["agreement_f1_ci95"]
            ax.errorbar([x], [y], yerr=[[y - low], [high - y]], color=colour, capsize=2, elinewidth=0.8, alpha=0.6)
            marker = "o" if mode in RATIO_FREE else _ratio_marker(ratios, row["ratio"])
            ax.plot([x], [y], marker=marker, color=colour, markersize=7, markeredgecolor="black",
                    markeredgewidth=0.5, linestyle="none")
    reference = summary.get(REFERENCE_MODE)
    if reference is not None:
        ax.axvline(reference["ttft_s_median"], color="gray", linestyle="--")
    ax.axhline(TARGET_AGREEMENT, color="red", linestyle=":")
    ax.set_xlabel("TTFT median (s)")
    ax.set_ylabel("agreement F1 with full prefill (95% CI)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(0.0, 1.02)
    ax.grid(alpha=0.3)
    mode_handles = [Line2D([], [], color=MODE_COLOURS.get(m, f"C{i}"), linewidth=2, label=m)
                    for i, m in enumerate(modes)]
    mode_handles += [Line2D([], [], color="gray", linestyle="--", label="full prefill TTFT"),
                     Line2D([], [], color="red", linestyle=":", label=f"agreement {TARGET_AGREEMENT:g}")]
    ratio_handles = [Line2D([], [], marker=_ratio_marker(ratios, r), color="white", markerfacecolor="lightgray",
                            markeredgecolor="black", markersize=7, label=f"r = {r:g}") for r in ratios]
    first = ax.legend(handles=mode_handles, fontsize=8, loc="lower left", title="mode", title_fontsize=8)
    ax.add_artist(first)
    if ratio_handles:
        ax.legend(handles=ratio_handles, fontsize=8, loc="lower right", title="recompute ratio", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_result(result: dict[str, Any], path: Path) -> None:
    """Plot a frontier result JSON, titled by its data, records, engine, dtype and CPU capability."""
    title = (f"{Path(result['data']).name}, {result['records']} records, {result['engine']} engine\n"
             f"{result['dtype']} ({result['hardware']})")
    plot(result["modes"], title, path)


def main() -> None:
    """Redraw a stored frontier result."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", type=Path, help="a bench/frontier.py --out JSON")
    parser.add_argument("plot", type=Path, help="the PNG to write")
    args = parser.parse_args()
    plot_result(json.loads(args.result.read_text()), args.plot)


if __name__ == "__main__":
    main()
