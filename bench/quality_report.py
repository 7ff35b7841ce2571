"""Render the JSON results under docs/results as the markdown tables quoted in docs/quality.md."""
import json
import sys
from pathlib import Path

RESULTS = Path("docs/results")
EVAL_COLUMNS = ("f1", "agreement_f1", "first_token_kl", "ttft_s_median", "ttft_s_mean", "context_tokens_mean",
                "recomputed_fraction")


def eval_table(path: Path) -> str:
    """One row per mode, with TTFT speed-up against full prefill measured in the same run."""
    doc = json.loads(path.read_text())
    modes = doc["modes"]
    base = modes["full_prefill"]["ttft_s_median"]
    lines = [f"`{doc['data']}`, {doc['records']} records, model {doc['model']}", "",
             "| mode | " + " | ".join(EVAL_COLUMNS) + " | TTFT speed-up (median) |",
             "|---" * (len(EVAL_COLUMNS) + 2) + "|"]
    for mode, row in modes.items():
        cells = [f"{row[c]:.3f}" if c != "context_tokens_mean" else f"{row[c]:.0f}" for c in EVAL_COLUMNS]
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {base / row['ttft_s_median']:.2f}x |")
    return "\n".join(lines)


def halves_table(paths: list[Path]) -> str:
    """Record-weighted means over several runs of one dataset, with each run's TTFT median beside them."""
    docs = [json.loads(p.read_text()) for p in paths]
    total = sum(d["records"] for d in docs)
    means = ("f1", "agreement_f1", "first_token_kl", "ttft_s_mean", "recomputed_fraction")
    lines = [f"`{docs[0]['data']}`, {total} records in {len(docs)} runs: means weighted by records; TTFT medians "
             "and speed-ups per run", "",
             "| mode | " + " | ".join(means) + " | " + " | ".join(f"ttft_s_median run {i + 1}" for i in range(len(docs)))
             + " | speed-up per run |", "|---" * (len(means) + len(docs) + 2) + "|"]
    for mode in docs[0]["modes"]:
        cells = [f"{sum(d['modes'][mode][c] * d['records'] for d in docs) / total:.3f}" for c in means]
        medians = [d["modes"][mode]["ttft_s_median"] for d in docs]
        speedups = [d["modes"]["full_prefill"]["ttft_s_median"] / m for d, m in zip(docs, medians)]
        lines.append(f"| {mode} | " + " | ".join(cells) + " | " + " | ".join(f"{m:.3f}" for m in medians)
                     + " | " + " / ".join(f"{x:.2f}x" for x in speedups) + " |")
    return "\n".join(lines)


def study_table(path: Path) -> str:
    """Rows per (chunk context, configuration) of the design study."""
    doc = json.loads(path.read_text())
    lines = [f"`{doc['data']}`, {doc['records']} records, ratio {doc['ratio']}", "",
             "| configuration | first_token_kl | kv_mse | hkvd_recall |", "|---|---|---|---|"]
    for label, row in doc["results"].items():
        recall = f"{row['hkvd_recall']:.3f}" if "hkvd_recall" in row else "-"
        lines.append(f"| {label} | {row['first_token_kl']:.4f} | {row['kv_mse']:.5f} | {recall} |")
    return "\n".join(lines)


def sweep_table(path: Path) -> str:
    """Agreement F1, first-token KL and TTFT per (mode, ratio) of the sweep."""
    doc = json.loads(path.read_text())
    lines = [f"`{doc['data']}`, {doc['records']} records", "",
             "| run | agreement_f1 | first_token_kl | ttft_s_median | recomputed_fraction |", "|---|---|---|---|---|"]
    for label, row in doc["runs"].items():
        lines.append(f"| {label} | {row['agreement_f1']:.3f} | {row['first_token_kl']:.4f} | "
                     f"{row['ttft_s_median']:.3f} | {row['recomputed_fraction']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    """Write every table whose JSON exists to stdout."""
    renderers = {"musique_cacheblend_1-50.json": eval_table, "musique_cacheblend_51-100.json": eval_table,
                 "hotpotqa_hipporag.json": eval_table,
                 "fusion_study.json": study_table, "quality_sweep.json": sweep_table}
    for name, render in renderers.items():  # a file not yet produced is skipped
        if (RESULTS / name).is_file():
            sys.stdout.write(f"### {name}\n\n{render(RESULTS / name)}\n\n")
    halves = [RESULTS / "musique_cacheblend_1-50.json", RESULTS / "musique_cacheblend_51-100.json"]
    if all(p.is_file() for p in halves):
        sys.stdout.write(f"### musique_cacheblend (all records)\n\n{halves_table(halves)}\n\n")


if __name__ == "__main__":
    main()
