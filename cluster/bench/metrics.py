"""Summaries of a benchmark run: latency percentiles (DDSketch), throughput, reuse per tier, answer agreement."""
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ddsketch import DDSketch

from cluster.bench.client import Outcome
from workers.evaluation.scoring import best_f1, token_f1

QUANTILES = (0.5, 0.9, 0.95, 0.99)
RELATIVE_ACCURACY = 0.01  # a quantile within 1% of the true value, whatever the range


def percentiles(values: Iterable[float]) -> dict[str, float | int]:
    """count, mean and p50/p90/p95/p99 of `values` (DDSketch, 1% relative accuracy); only count when empty."""
    sketch = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
    for value in values:
        sketch.add(max(value, 1e-9))  # a zero latency (two chunks in one read) still counts
    if sketch.count == 0:
        return {"count": 0}
    summary: dict[str, float | int] = {"count": int(sketch.count), "mean": round(sketch.avg, 4)}
    for q in QUANTILES:
        summary[f"p{round(q * 100)}"] = round(float(sketch.get_quantile_value(q)), 4)
    return summary


def summarize(outcomes: Sequence[Outcome], duration_s: float) -> dict[str, Any]:
    """One system's figures over one load point: latencies, throughput, and what blendserve reused."""
    done = [o for o in outcomes if o.ok]
    reused: Counter[str] = Counter()
    for outcome in done:
        reused.update((outcome.blend or {}).get("reused_tokens", {}))
    prompt_tokens = sum(o.prompt_tokens for o in done)
    recomputed = sum((o.blend or {}).get("recomputed_tokens", 0) for o in done)
    with_blend = [o for o in done if o.blend]
    return {
        "num_requests": len(outcomes),
        "num_ok": len(done),
        "duration_s": round(duration_s, 3),
        "throughput_req_s": round(len(done) / duration_s, 4) if duration_s > 0 else 0.0,
        "output_tok_s": round(sum(o.output_tokens for o in done) / duration_s, 3) if duration_s > 0 else 0.0,
        "ttft_s": percentiles(o.ttft_s for o in done),
        "itl_s": percentiles(gap for o in done for gap in o.itl_s),
        "e2e_s": percentiles(o.latency_s for o in done),
        "server_ttft_s": percentiles(o.blend["ttft_s"] for o in with_blend if "ttft_s" in o.blend),
        # The HTTP path's share of the client's TTFT: what the worker's own TTFT (from arrival at its replica) leaves.
        "http_s": percentiles(o.ttft_s - o.blend["ttft_s"] for o in with_blend if "ttft_s" in o.blend),
        "http_fraction": percentiles((o.ttft_s - o.blend["ttft_s"]) / o.ttft_s for o in with_blend
                                     if "ttft_s" in o.blend and o.ttft_s > 0),
        "ingress_s": percentiles(o.blend["ingress_s"] for o in with_blend if "ingress_s" in o.blend),
        "stages_s": stage_medians(with_blend),
        "prompt_tokens": prompt_tokens,
        "reused_tokens": dict(sorted(reused.items())),
        "reused_fraction": round(sum(reused.values()) / prompt_tokens, 4) if prompt_tokens and with_blend else None,
        "recomputed_tokens": recomputed if with_blend else None,
        "recompute_fraction": round(recomputed / prompt_tokens, 4) if prompt_tokens and with_blend else None,
        "errors": [o.error for o in outcomes if not o.ok][:5],
    }


def stage_medians(outcomes: Sequence[Outcome]) -> dict[str, dict[str, float]]:
    """Per plan that ran (blend, plain), the median seconds of each stage of the worker's TTFT, and how many."""
    by_plan: dict[str, list[dict[str, float]]] = {}
    for outcome in outcomes:
        stages = (outcome.blend or {}).get("stages_s")
        if stages:
            by_plan.setdefault(outcome.blend.get("plan", "blend"), []).append(stages)
    return {
        plan: {"count": len(rows)} | {stage: round(statistics.median(row.get(stage, 0.0) for row in rows), 4)
                                      for stage in sorted({stage for row in rows for stage in row})}
        for plan, rows in sorted(by_plan.items())
    }


def agreement(answers: Mapping[str, str], references: Mapping[str, str]) -> dict[str, float | int]:
    """Token F1 of each answer against the reference answer to the same request id, and exact-match share."""
    shared = [rid for rid in answers if rid in references]
    if not shared:
        return {"count": 0}
    f1 = [token_f1(answers[rid], references[rid]) for rid in shared]
    same = sum(answers[rid].strip() == references[rid].strip() for rid in shared)
    return {"count": len(shared), "f1_mean": round(sum(f1) / len(f1), 4), "identical": round(same / len(shared), 4)}


def gold_f1(answers: Mapping[str, str], gold: Mapping[str, Sequence[str]]) -> float | None:
    """Mean best token F1 of answers against their requests' gold answers (None without any gold)."""
    scored = [best_f1(text, list(gold[rid])) for rid, text in answers.items() if gold.get(rid)]
    return round(sum(scored) / len(scored), 4) if scored else None


def reuse_timeline(outcomes: Sequence[Outcome], window_s: float) -> list[dict[str, Any]]:
    """Reused tokens per tier and prompt tokens, per window of send time: how reuse builds up over a run."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    windows: dict[int, Counter[str]] = {}
    for outcome in outcomes:
        if not outcome.ok:
            continue
        bucket = windows.setdefault(int(outcome.sent_s // window_s), Counter())
        bucket.update((outcome.blend or {}).get("reused_tokens", {}))
        bucket["prompt"] += outcome.prompt_tokens
    return [{"start_s": index * window_s, **dict(counts)} for index, counts in sorted(windows.items())]


def throughput_at_p95(points: Sequence[tuple[float, float]], p95_s: float) -> float:
    """The most throughput a system reaches with p95 TTFT within `p95_s`, from its (throughput, p95) load points;
    linear between the last point within the budget and the first beyond it (0 when none is within)."""
    ordered = sorted(points)
    best = 0.0
    for (low_tput, low_p95), (high_tput, high_p95) in zip([(0.0, 0.0), *ordered], ordered):
        if high_p95 <= p95_s:
            best = max(best, high_tput)
        elif low_p95 <= p95_s < high_p95 and (low_tput, low_p95) != (0.0, 0.0):
            best = max(best, low_tput + (high_tput - low_tput) * (p95_s - low_p95) / (high_p95 - low_p95))
    return best
