"""blendserve runs of `blendserve bench serve` on the same workload, each against the first: TTFT, tiers, answers.

Per run (its first load point): TTFT p50 and p95 through HTTP, the worker's own TTFT p50, the share of prompt
tokens served from each tier; against the first run: the ratio of TTFT medians (first over this one, above 1:
this run faster) with a 95% interval (requests resampled in pairs: the same request in both runs), and the
agreement of the answers (token F1, identical share) with the first run's. With `--reference`, each run's answers
are also scored against another system's answers to the same requests (plain vLLM's: full prefill), and the paired
difference of that agreement from the first run's is given with its 95% interval.

    .venv/bin/python bench/serve_compare.py --run none=docs/results/compression/replay_none.json \
        --run int8=docs/results/compression/replay_int8.json --out docs/results/compression/replay_summary.json
    .venv/bin/python bench/serve_compare.py --run planned=planned.json --run blend=blend.json \
        --reference vllm=planned.json --out served_agreement.json
"""
import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from cluster.bench.metrics import agreement
from workers.evaluation.bootstrap import paired_difference_interval, paired_median_ratio_interval
from workers.evaluation.scoring import token_f1


def requests_of(path: Path, system: str = "blendserve") -> list[dict[str, Any]]:
    """The answered requests of the run's first load point, of `system`."""
    point = json.loads(path.read_text())["systems"][system]["points"][0]
    return [r for r in point["requests"] if r["ok"]]


def reference_difference(
    base: dict[str, str], other: dict[str, str], reference: dict[str, str]
) -> dict[str, Any]:
    """Token F1 with the reference's answer, `other` minus `base`, over the requests all three answered."""
    ids = sorted(set(base) & set(other) & set(reference))
    if not ids:
        return {"count": 0}
    first = [token_f1(base[i], reference[i]) for i in ids]
    second = [token_f1(other[i], reference[i]) for i in ids]
    low, high = paired_difference_interval(second, first)
    return {"difference": round(float(np.mean(second) - np.mean(first)), 4), "low": round(low, 4),
            "high": round(high, 4), "count": len(ids)}


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
    parser.add_argument("--reference", help="SYSTEM=result.json: score every run's answers against this system's.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = dict(item.split("=", 1) for item in args.run)
    base_label = next(iter(runs))
    base = requests_of(Path(runs[base_label]))
    reference = None
    if args.reference:
        system, path = args.reference.split("=", 1)
        reference = {r["id"]: r["text"] for r in requests_of(Path(path), system)}
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
        if reference is not None:
            answers = {r["id"]: r["text"] for r in requests}
            rows[label]["answers_vs_reference"] = agreement(answers, reference)
            rows[label][f"reference_f1_minus_{base_label}"] = reference_difference(
                {r["id"]: r["text"] for r in base}, answers, reference)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
