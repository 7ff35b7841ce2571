"""query_boundary's guard and span alignment, side by side on split_fact and multi_key instances.

Variants, all at r = 0.15 beside full prefill and EPIC (accuracy against the gold answer, vLLM engine):

- `guard_0`: query_boundary without its guard (the 4 tokens before each inexact chunk may be recomputed);
- `guard_4`: query_boundary as served;
- `aligned_guard_4`, `aligned_guard_16`: spans aligned to each chunk's start instead of to absolute positions,
  so none straddles a boundary, with a guard of 4 or 16 tokens;
- `guard_0_l14`, `aligned_guard_16_l14`: the same with the scout's attention read at layers 0-14 only.

    .venv/bin/python bench/boundary_guard.py --out docs/results/tasks/boundary_guard.jsonl

The split_fact instances are the 16 of docs/results/tasks/split_fact_openings.jsonl (where the unguarded rule
failed) and numbers 100-139; the multi_key ones the first 60.
"""
import argparse
import json
from pathlib import Path

import torch

from workers.evaluation.dataset import load_records
from workers.evaluation.engines import load_eval_engine
from workers.evaluation.evaluate import EvalRun, evaluate
from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.baselines.epic import Epic
from workers.fusion.baselines.full_prefill import FullPrefill
from workers.fusion.deviation import keep_top_spans, ratio_count
from workers.fusion.layout import BlendLayout
from workers.fusion.query_boundary import QueryBoundary, boundary_guard
from workers.fusion.query_driven import QueryScoring, selectable_mask

TASKS = Path("docs/results/tasks")
RATIO = 0.15


def chunk_aligned_positions(layout: BlendLayout, span_tokens: int) -> torch.Tensor:
    """Positions renumbered so that every segment starts at a multiple of span_tokens. # [kv_end]"""
    positions = torch.zeros(layout.kv_end, dtype=torch.long)
    base = 0
    for seg in layout.segments:
        end = min(seg.end, layout.kv_end)
        if end > seg.start:
            positions[seg.start : end] = base + torch.arange(end - seg.start)
            base += -(-(end - seg.start) // span_tokens) * span_tokens
    return positions


class AlignedBoundary(QueryBoundary):
    """query_boundary with its spans aligned to each chunk's start."""

    def choose(self, layout: BlendLayout, relevance: torch.Tensor, recompute_ratio: float) -> torch.Tensor:
        span_tokens = self.options.selection_span_tokens
        free = selectable_mask(layout) & ~boundary_guard(layout, span_tokens, self.guard_tokens)
        num_keep = min(ratio_count(recompute_ratio, int((~layout.forced).sum())), int(free.sum()))
        scores = self.ranking(layout, relevance).masked_fill(~free, 0.0)
        keep = keep_top_spans(scores, ~free, num_keep, chunk_aligned_positions(layout, span_tokens), span_tokens)
        mask = torch.zeros_like(layout.forced)
        mask[keep] = True
        return (mask & (free | layout.forced)).nonzero().squeeze(1)


def variants(options: FusionOptions) -> dict[str, FusionMode]:
    """Every variant and the two controls, by name."""
    early = QueryScoring(last_layer=14)
    named: dict[str, FusionMode] = {"full_prefill": FullPrefill(options), "epic": Epic(options)}
    for name, mode in {
        "guard_0": QueryBoundary(options, guard_tokens=0),
        "guard_4": QueryBoundary(options, guard_tokens=4),
        "aligned_guard_4": AlignedBoundary(options, guard_tokens=4),
        "aligned_guard_16": AlignedBoundary(options, guard_tokens=16),
        "guard_0_l14": QueryBoundary(options, early, guard_tokens=0),
        "aligned_guard_16_l14": AlignedBoundary(options, early, guard_tokens=16),
    }.items():
        mode.name = name
        named[name] = mode
    return named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    split = {r.id: r for r in load_records(TASKS / "split_fact_k10_t2000.jsonl")}
    picked = [json.loads(line)["record"] for line in (TASKS / "split_fact_openings.jsonl").open()]
    picked += [i for i in split if 100 <= int(i.rsplit("-", 1)[1]) < 140]
    records = [split[i] for i in picked] + load_records(TASKS / "multi_key_k5_t1000.jsonl", limit=60)
    modes = variants(FusionOptions())
    access = load_eval_engine("vllm", modes=modes)
    runs = [EvalRun(name, name, 1.0 if name == "full_prefill" else RATIO) for name in modes]
    tally: dict[str, dict[str, float]] = {}
    with args.out.open("w") as out:
        for record in records:
            scores, _ = evaluate(access, [record], runs, max_new_tokens=24, teacher_forced=False, warm_up=False)
            row = {"record": record.id, **{s.label: s.accuracy for s in scores},
                   **{f"{s.label}_ttft_s": round(s.ttft_s, 4) for s in scores}}
            out.write(json.dumps(row) + "\n")
            out.flush()
            family = tally.setdefault(record.id.split("-")[0], {})
            for s in scores:
                family[s.label] = family.get(s.label, 0.0) + float(s.accuracy or 0.0)
    for family, answered in tally.items():
        print(family, ", ".join(f"{name} {count:.0f}" for name, count in answered.items()))


if __name__ == "__main__":
    main()
