"""blendserve runs of `blendserve bench serve` on the same workload, each against the first: TTFT, tiers, answers.

Per run (its first load point): TTFT p50 and p95 through HTTP, the worker's own TTFT p50, the share of prompt
tokens served from each tier; against the first run: the ratio of TTFT medians (first over this one, above 1:
this run faster) with a 95% interval (requests resampled in pairs: the same request in both runs), and the
agreement of the answers (token F1, identical share) with the first run's.

    .venv/bin/python bench/serve_compare.py --run none=docs/results/compression/replay_none.json \
        --run int8=docs/results/compression/replay_int8.json --out docs/results/compression/replay_summary.json
"""
import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from cluster.bench.metrics import agreement
from workers.evaluation.bootstrap import paired_median_ratio_interval


def requests_of(path: Path) -> list[dict[str, Any]]:
    """The answered requests of the run's first load point, blendserve's."""
    point = json.loads(path.read_text())["systems"]["blendserve"]["points"][0]
    return [r for r in point["requests"] if r["ok"]]


def median_ratio(base: dict[str, float], other: dict[str, float]) -> dict[str, float]:
    """median(base) / median(other) over the requests both answered, with a paired bootstrap 95% interval."""
    ids = sorted(set(base) & set(other))
    first, second = [base[i] for i in ids], [other[i] for i in ids]
    low, high = paired_median_ratio_interval(first, second)
    return {"ratio": round(float(np.median(first) / np.median(second)), 3), "low": round(low, 3),
            "high": round(high, 3), "count": len(ids)}


def summarize_run(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT percentiles (client and worker) and the share of prompt tokens each tier served."""
    ttft = [r["ttft_s"] for r in requests]
    tiers: dict[str, int] = {}
    for request in requests:
        for tier, tokens in request["blend"]["reused_tokens"].items():
            tiers[tier] = tiers.get(tier, 0) + tokens
    prompt_tokens = sum(r["prompt_tokens"] for r in requests)
    return {
        "ttft_p50_s": round(float(np.median(ttft)), 3), "ttft_p95_s": round(float(np.percentile(ttft, 95)), 3),
        "worker_ttft_p50_s": round(float(np.median([r["blend"]["ttft_s"] for r in requests])), 3),
        "tier_share": {tier: round(tokens / prompt_tokens, 3) for tier, tokens in sorted(tiers.items())},
        "plans": sorted({r["blend"].get("plan", "") for r in requests}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, help="LABEL=result.json; the first is the base.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = dict(item.split("=", 1) for item in args.run)
    base_label = next(iter(runs))
    base = requests_of(Path(runs[base_label]))
    rows = {}
    for label, path in runs.items():
        requests = requests_of(Path(path))
        rows[label] = {
            "result": path, **summarize_run(requests),
            f"ttft_p50_ratio_vs_{base_label}": median_ratio({r["id"]: r["ttft_s"] for r in base},
                                                            {r["id"]: r["ttft_s"] for r in requests}),
            f"answers_vs_{base_label}": agreement({r["id"]: r["text"] for r in requests},
                                                  {r["id"]: r["text"] for r in base}),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
