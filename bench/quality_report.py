"""Render frontier results (bench/frontier.py --out) as markdown tables, by default those docs/quality.md quotes."""
import json
import sys
from pathlib import Path
from typing import Any

FRONTIER_RESULTS = Path("docs/results/frontier")
TARGET = 0.90


def interval(row: dict[str, Any], metric: str, digits: int = 3) -> str:
    """`mean [low, high]`, or `-` when the run did not measure it."""
    if metric not in row:
        return "-"
    low, high = row[f"{metric}_ci95"]
    return f"{row[metric]:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def frontier_table(doc: dict[str, Any]) -> str:
    """One row per mode and ratio, TTFT speed-up against full prefill measured in the same run."""
    modes = doc["modes"]
    base = modes["full_prefill"]["ttft_s_median"]
    lines = [f"`{Path(doc['data']).name}`, {doc['records']} records, {doc['engine']} engine, {doc['dtype']} "
             f"({doc['hardware']})", "",
             "| run | agreement F1 [95% CI] | exact match | first token agrees | first-token KL | teacher-forced KL "
             "[95% CI] | NLL gap | TTFT median (s) | speed-up | recomputed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, row in modes.items():
        lines.append(
            f"| {label} | {interval(row, 'agreement_f1')} | {row['exact_match']:.2f} | "
            f"{row['first_token_agreement']:.2f} | {row.get('first_token_kl', 0.0):.4f} | "
            f"{interval(row, 'tf_kl', 4)} | {row.get('tf_nll_gap', 0.0):.4f} | {row['ttft_s_median']:.3f} | "
            f"{base / row['ttft_s_median']:.2f}x | {row['recomputed_fraction']:.3f} |")
    return "\n".join(lines)


def reach_table(doc: dict[str, Any]) -> str:
    """Per mode, the smallest ratio whose mean agreement F1 reaches the target (and its interval's low end)."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for row in doc["modes"].values():
        by_mode.setdefault(row["mode"], []).append(row)
    lines = [f"| mode | smallest ratio with agreement F1 >= {TARGET} | its agreement [95% CI] | best reached |",
             "|---|---|---|---|"]
    for mode, rows in by_mode.items():
        if mode == "full_prefill":
            continue
        rows.sort(key=lambda r: r["ratio"])
        hit = next((r for r in rows if r["agreement_f1"] >= TARGET), None)
        best = max(rows, key=lambda r: r["agreement_f1"])
        reached = f"{hit['ratio']:g}" if hit else f"not within {rows[-1]['ratio']:g}"
        lines.append(f"| {mode} | {reached} | {interval(hit, 'agreement_f1') if hit else '-'} | "
                     f"{best['agreement_f1']:.3f} at {best['ratio']:g} |")
    return "\n".join(lines)


def main() -> None:
    """Print the tables of every frontier result given (default: the frontiers in docs/results/frontier/)."""
    paths = [Path(p) for p in sys.argv[1:]] or sorted(
        p for p in FRONTIER_RESULTS.glob("frontier_*.json") if not p.name.startswith("frontier_pairs_"))
    for path in paths:
        doc = json.loads(path.read_text())
        print(f"### {path.name}\n\n{frontier_table(doc)}\n\n{reach_table(doc)}\n")


if __name__ == "__main__":
    main()
