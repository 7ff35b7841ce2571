"""Where should a fact-finding prompt's recompute budget go? Placement rules side by side at r = 0.15 (vLLM engine).

Each rule is query_boundary's scout and guard with its own choice of positions; rows per instance say which
answered. Oracle rules know the needle's chunk (the document holding the answer):

- `served`: query_boundary as served;
- `needle_whole` / `needle_plus`: the needle's chunk recomputed whole, alone / then query_boundary's ranking;
- `near_needle`: the needle's chunk and its two neighbours whole;
- `served_no_needle`: query_boundary's ranking with the needle's chunk left out;
- `reuse`: nothing recomputed (full reuse, through the same path);
- `no_last_chunk`: query_boundary's ranking with the context's last chunk left out;
- `tail`: the context's last tokens; `tail<s>`: a share s of the budget on each inexact chunk's opening first;
- `mix<o>_<t>`: a share o on openings, t of the rest on the tail, the remainder by query_boundary's ranking
  (mix0.25_0.5 was measured as the mode `query_tail` on 100 instances a family and not kept);
  `mix<o>_<t>_skip`: the chunk holding the best-ranked token left out.

    .venv/bin/python bench/tail_rules.py --data docs/results/tasks/single_fact_k20_t4000.jsonl --limit 30 \\
        --rules served,needle_whole,needle_plus,near_needle,reuse --out docs/results/tail_rules/oracle_single_fact.jsonl
"""
import argparse
import json
from pathlib import Path

import torch

from workers.evaluation.dataset import load_records
from workers.evaluation.engines import load_eval_engine
from workers.evaluation.evaluate import EvalRun, evaluate
from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.baselines.full_prefill import FullPrefill
from workers.fusion.deviation import keep_top_spans, ratio_count
from workers.fusion.layout import BlendLayout, Segment
from workers.fusion.query_boundary import QueryBoundary, boundary_guard
from workers.fusion.query_driven import selectable_mask

RATIO = 0.15
ORACLES = ("served", "needle_whole", "needle_plus", "near_needle", "served_no_needle", "reuse", "no_last_chunk")


class Placement(QueryBoundary):
    """query_boundary with the positions chosen by a named rule; `needle` is set per instance."""

    def __init__(self, options: FusionOptions, rule: str) -> None:
        super().__init__(options)
        self.rule = rule
        self.needle = -1

    def relevance(self, runner, layout, cache, feed) -> torch.Tensor:  # noqa: ANN001 - QueryDriven's signature
        """The scout's scores; none for the tail rules, which read no question (their TTFT has no scout)."""
        if self.rule.startswith("tail"):
            return torch.zeros(layout.kv_end)
        return super().relevance(runner, layout, cache, feed)

    def choose(self, layout: BlendLayout, relevance: torch.Tensor, recompute_ratio: float) -> torch.Tensor:
        span = self.options.selection_span_tokens
        guard = boundary_guard(layout, span, self.guard_tokens)
        scores = self.ranking(layout, relevance)
        if self.rule.startswith(("tail", "mix")):
            opening, tail, skip = _shares(self.rule)
            if skip:
                guard = guard | _best_read_chunk(layout, scores)
            return anchored_choice(layout, scores, recompute_ratio, span, guard, opening, tail)
        free = selectable_mask(layout) & ~guard
        budget = min(ratio_count(recompute_ratio, int((~layout.forced).sum())), int(free.sum()))
        chunks = layout.chunk_segments()
        keep = torch.zeros(layout.kv_end, dtype=torch.bool)
        needle = chunks[self.needle] if 0 <= self.needle < len(chunks) else None
        if self.rule in ("served", "served_no_needle", "no_last_chunk"):
            left_out = {"served_no_needle": needle, "no_last_chunk": chunks[-1]}.get(self.rule)
            if left_out is not None:
                free[left_out.start : left_out.end] = False
            ranked = scores.masked_fill(~free, 0.0)
            keep[keep_top_spans(ranked, ~free, budget, torch.arange(layout.kv_end), span)] = True
        elif self.rule in ("needle_whole", "needle_plus") and needle is not None:
            keep[needle.start : needle.end] = True
            keep &= free
            rest = budget - int(keep.sum())
            if self.rule == "needle_plus" and rest > 0:
                blocked = ~free | keep
                ranked = scores.masked_fill(blocked, 0.0)
                keep[keep_top_spans(ranked, blocked, rest, torch.arange(layout.kv_end), span)] = True
        elif self.rule == "near_needle" and needle is not None:
            for seg in chunks[max(0, self.needle - 1) : self.needle + 2]:
                keep[seg.start : seg.end] = True
        return ((keep & free) | layout.forced).nonzero().squeeze(1)


def _shares(rule: str) -> tuple[float, float, bool]:
    """(opening share, tail share, skip) of a `tail<s>` or `mix<o>_<t>[_skip]` rule."""
    if rule.startswith("tail"):
        return float(rule[4:] or 0.0), 1.0, False
    opening, tail, *skip = rule[3:].split("_")
    return float(opening), float(tail), bool(skip)


def _best_read_chunk(layout: BlendLayout, scores: torch.Tensor) -> torch.Tensor:
    """The chunk holding the best-ranked selectable token. # -> [kv_end] bool"""
    best = int(scores.float().masked_fill(~selectable_mask(layout), 0.0).argmax())
    mask = torch.zeros(layout.kv_end, dtype=torch.bool)
    seg: Segment | None = next((s for s in layout.chunk_segments() if s.start <= best < s.end), None)
    if seg is not None:
        mask[seg.start : min(seg.end, layout.kv_end)] = True
    return mask


def anchored_choice(
    layout: BlendLayout,
    scores: torch.Tensor,
    recompute_ratio: float,
    span_tokens: int,
    excluded: torch.Tensor,
    opening_share: float,
    tail_share: float,
) -> torch.Tensor:
    """Forced positions plus ratio x the reused tokens: openings, then the tail, then the best-scoring spans.

    The budget counts every reused token and is spent on selectable ones only, never on `excluded`.
    scores: [kv_end], excluded: [kv_end] bool -> [K] ascending
    """
    free = selectable_mask(layout) & ~excluded
    budget = min(ratio_count(recompute_ratio, int((~layout.forced).sum())), int(free.sum()))
    keep = torch.zeros(layout.kv_end, dtype=torch.bool)
    exact_end = layout.exact_end()
    for seg in layout.chunk_segments():
        if seg.start >= exact_end:
            opening = ratio_count(recompute_ratio * opening_share, seg.num_tokens)
            keep[seg.start : min(seg.start + opening, layout.kv_end)] = True
    keep &= free
    tail = int((budget - int(keep.sum())) * tail_share)
    if tail > 0:
        keep[(free & ~keep).nonzero().squeeze(1)[-tail:]] = True
    rest = budget - int(keep.sum())
    if rest > 0:
        blocked = ~free | keep
        ranked = scores.float().masked_fill(blocked, 0.0)
        keep[keep_top_spans(ranked, blocked, rest, torch.arange(layout.kv_end), span_tokens)] = True
    return ((keep & free) | layout.forced).nonzero().squeeze(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--rules", required=True, help="comma-separated rules (above)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    options = FusionOptions()
    rules = [rule.strip() for rule in args.rules.split(",") if rule.strip()]
    unknown = [rule for rule in rules if rule not in ORACLES and not rule.startswith(("tail", "mix"))]
    if unknown:
        parser.error(f"unknown rules {unknown}")
    placements = {rule: Placement(options, rule) for rule in rules}
    modes: dict[str, FusionMode] = {"full_prefill": FullPrefill(options)}
    for rule, mode in placements.items():
        mode.name = rule
        modes[rule] = mode
    access = load_eval_engine("vllm", modes=modes)
    runs = [EvalRun(name, name, 1.0 if name == "full_prefill" else RATIO) for name in modes]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["record"] for line in args.out.open()} if args.out.exists() else set()
    with args.out.open("a") as out:
        for record in load_records(args.data, limit=args.limit):
            if record.id in done:
                continue
            needle = next((i for i, doc in enumerate(record.documents) if record.answers[0] in doc), -1)
            for mode in placements.values():
                mode.needle = needle
            scores, _ = evaluate(access, [record], runs, max_new_tokens=24, teacher_forced=False, warm_up=False)
            row: dict[str, object] = {"record": record.id, "needle_chunk": needle}
            for score in scores:
                row[score.label] = score.accuracy
                row[f"{score.label}_ttft_s"] = round(score.ttft_s, 4)
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
