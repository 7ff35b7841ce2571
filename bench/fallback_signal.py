"""Does cacheblend's fallback signal tell which requests blend badly? (docs/studies/fallback_signal.md)

The signal (`FusionOptions.fallback.min_coverage` acts on it) is the share of the check layer's KV deviation
that the tokens kept at the request's ratio hold. Per record: chunk KV stored, cacheblend fused at --ratio (not
timed), its check-layer coverage read; then joined with the frontier's rows for the same records (cacheblend's
agreement F1 and teacher-forced KL at that ratio, and full reuse's KL: the share of full reuse's divergence
cacheblend leaves). Reports Spearman correlations over records and, per coverage threshold, the quality of the
requests the fallback would raise against the rest.
"""
import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from workers.evaluation.arguments import add_record_arguments
from workers.evaluation.bootstrap import bootstrap_interval
from workers.evaluation.dataset import load_records
from workers.evaluation.engines import load_eval_engine
from workers.evaluation.evaluate import NAMESPACE, EngineAccess, read_rows
from workers.evaluation.rank_correlation import spearman
from workers.model.dtype import measured_on

THRESHOLDS = (0.5, 0.6, 0.7)


def check_coverages(access: EngineAccess, data: Path, limit: int, offset: int, ratio: float) -> dict[str, float]:
    """Record id -> the check layer's coverage when cacheblend fuses it at `ratio`."""
    engine, coverages = access.engine, {}
    for record in load_records(data, limit, offset):
        engine.store_documents(record.documents, NAMESPACE)
        prompt = engine.fuser.layout(record.documents, record.question)
        fused = access.call(lambda prompt=prompt: engine.fuser.fuse(
            prompt, "cacheblend", ratio, NAMESPACE, kv_end=access.kv_end(prompt)))
        coverages[record.id] = fused.prefill.check_coverage
    return coverages


def _group(values: list[float]) -> dict[str, Any]:
    """Mean and 95% bootstrap interval (None for an empty group)."""
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": statistics.fmean(values), "ci95": list(bootstrap_interval(values))}


def signal_report(coverages: dict[str, float], rows_path: Path, ratio: float) -> dict[str, Any]:
    """Correlations of coverage with each quality figure, and the quality below vs above each threshold."""
    rows = {(row.record, row.label): row for row in read_rows(rows_path)}
    ids = [i for i in coverages if (i, f"cacheblend@{ratio:g}") in rows and (i, "full_reuse") in rows]
    blended = [rows[(i, f"cacheblend@{ratio:g}")] for i in ids]
    reused = [rows[(i, "full_reuse")] for i in ids]
    figures = {
        "agreement_f1": [row.agreement_f1 for row in blended],
        "tf_kl": [row.tf_kl for row in blended],
        "kl_left": [b.tf_kl / r.tf_kl if r.tf_kl > 0 else 0.0 for b, r in zip(blended, reused)],
        "agreement_gain_over_full_reuse": [b.agreement_f1 - r.agreement_f1 for b, r in zip(blended, reused)],
    }
    signal = torch.tensor([coverages[i] for i in ids])
    report: dict[str, Any] = {
        "records": len(ids),
        "coverage": {"mean": float(signal.mean()), "min": float(signal.min()), "max": float(signal.max()),
                     "p10": float(signal.quantile(0.1)), "p90": float(signal.quantile(0.9))},
        "spearman": {name: spearman(signal, torch.tensor(values)) for name, values in figures.items()},
        "by_threshold": {},
    }
    for threshold in [*THRESHOLDS, float(signal.median())]:
        low = [k for k, c in enumerate(signal.tolist()) if c < threshold]
        high = [k for k, c in enumerate(signal.tolist()) if c >= threshold]
        report["by_threshold"][f"{threshold:.3f}"] = {
            name: {"below": _group([values[k] for k in low]), "at_or_above": _group([values[k] for k in high])}
            for name, values in figures.items()
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_record_arguments(parser)
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--rows", type=Path, required=True, help="the frontier's per-record rows (bench/frontier.py)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    access = load_eval_engine(args.engine, dtype=args.dtype)
    try:
        coverages = check_coverages(access, args.data, args.limit, args.offset, args.ratio)
        dtype = access.engine.dtype
    finally:
        access.engine.close()
    result = {**measured_on(dtype), "engine": args.engine, "data": str(args.data), "ratio": args.ratio,
              "rows": str(args.rows), **signal_report(coverages, args.rows, args.ratio), "coverages": coverages}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
