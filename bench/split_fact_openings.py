"""Which recomputed tokens rescue a split fact: the value chunk's opening, the other openings, the key before it.

On split_fact instances (bench/tasks.py) the value opens chunk v, and its key ends chunk v - 1. Each variant
recomputes a fixed set of positions from layer 0, at EPIC's opening length (ratio x the chunk's tokens):

- `value_only`: chunk v's opening; `epic_but_value`: every other chunk's opening; `value_after`: the openings
  of chunks v..n-1;
- `value_key`: chunk v's opening and the 16 tokens before it (the key's end of chunk v - 1); `value_key_gap`:
  the same but the last 4 tokens before the boundary; `value_other_end`: chunk v's opening and the last 16
  tokens of another chunk (a run ending at a boundary that is not the key's);
- `value_tail`: chunk v's opening and the context's last tokens, as many as the rest of the budget.

    .venv/bin/python bench/split_fact_openings.py --data docs/results/tasks/split_fact_k10_t2000.jsonl \\
        --rows docs/results/tasks/rows_split_fact_k10_t2000_qb.jsonl --instances 16 \\
        --out docs/results/tasks/split_fact_openings.jsonl

`--rows` picks the instances: the first where full prefill and epic answer and query_boundary does not.
"""
import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch

from workers.evaluation.dataset import load_records
from workers.evaluation.engines import load_eval_engine
from workers.evaluation.evaluate import EvalRun, evaluate, read_rows
from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.baselines.epic import Epic
from workers.fusion.baselines.full_prefill import FullPrefill
from workers.fusion.deviation import ratio_count
from workers.fusion.layout import BlendLayout, Segment
from workers.fusion.query_boundary import QueryBoundary

KEY_TOKENS = 16
RATIO = 0.15
Chunks = Callable[[int, int], set[int]]  # (number of chunks, value chunk) -> chunks whose opening is recomputed
Extra = Callable[[list[Segment], int, float], list[range]]  # (chunks, value chunk, ratio) -> more positions


class Openings(FusionMode):
    """Recompute the openings of chunks `which` picks, plus the positions `extra` adds."""

    def __init__(self, options: FusionOptions, name: str, which: Chunks, extra: Extra | None = None) -> None:
        super().__init__(options)
        self.name, self.which, self.extra = name, which, extra
        self.value_chunk = 0  # set per instance before it is answered

    def initial(self, layout: BlendLayout, recompute_ratio: float) -> torch.Tensor:
        selected = layout.forced.clone()
        chunks = list(layout.chunk_segments())
        for index in self.which(len(chunks), self.value_chunk):
            seg = chunks[index]
            selected[seg.start : seg.start + ratio_count(recompute_ratio, seg.num_tokens)] = True
        for positions in self.extra(chunks, self.value_chunk, recompute_ratio) if self.extra else []:
            selected[positions.start : positions.stop] = True
        return selected.nonzero().squeeze(1)


def key_end(chunks: list[Segment], value: int, ratio: float, gap: int = 0) -> list[range]:
    """The KEY_TOKENS before the value chunk, less the last `gap`."""
    start = chunks[value].start
    return [range(start - KEY_TOKENS, start - gap)]


def other_end(chunks: list[Segment], value: int, ratio: float) -> list[range]:
    """The last KEY_TOKENS of a chunk that does not hold the key (the one after the value chunk, or before the key)."""
    other = value + 2 if value + 2 < len(chunks) else value - 1
    return [range(chunks[other].start - KEY_TOKENS, chunks[other].start)]


def context_tail(chunks: list[Segment], value: int, ratio: float) -> list[range]:
    """The context's last tokens, as many as the budget left after one opening."""
    count = ratio_count(ratio, sum(s.num_tokens for s in chunks)) - ratio_count(ratio, chunks[value].num_tokens)
    return [range(chunks[-1].end - count, chunks[-1].end)]


def variants(options: FusionOptions) -> dict[str, FusionMode]:
    """The controls and every opening variant, by name."""
    opening = [
        Openings(options, "value_only", lambda n, v: {v}),
        Openings(options, "epic_but_value", lambda n, v: set(range(n)) - {v}),
        Openings(options, "value_after", lambda n, v: set(range(v, n))),
        Openings(options, "value_key", lambda n, v: {v}, key_end),
        Openings(options, "value_key_gap", lambda n, v: {v}, lambda c, v, r: key_end(c, v, r, gap=4)),
        Openings(options, "value_other_end", lambda n, v: {v}, other_end),
        Openings(options, "value_tail", lambda n, v: {v}, context_tail),
    ]
    controls = [FullPrefill(options), Epic(options), QueryBoundary(options)]
    return {mode.name: mode for mode in controls + opening}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--rows", type=Path, required=True, help="An eval's rows: full_prefill, epic, query_boundary.")
    parser.add_argument("--instances", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    answered: dict[str, dict[str, float | None]] = {}
    for row in read_rows(args.rows):
        answered.setdefault(row.record, {})[row.label] = row.accuracy
    picked = [record for record, a in answered.items()
              if a.get("full_prefill") == a.get("epic") == 1 and a.get("query_boundary") == 0]
    records = {r.id: r for r in load_records(args.data)}
    modes = variants(FusionOptions())
    access = load_eval_engine("vllm", modes=modes)
    runs = [EvalRun(name, name, 1.0 if name == "full_prefill" else RATIO) for name in modes]
    rows = []
    with args.out.open("w") as out:
        for record_id in picked[: args.instances]:
            record = records[record_id]
            value = next(i for i, doc in enumerate(record.documents) if doc.startswith(record.answers[0]))
            for mode in modes.values():
                if isinstance(mode, Openings):
                    mode.value_chunk = value
            scores, _ = evaluate(access, [record], runs, max_new_tokens=24, teacher_forced=False, warm_up=False)
            rows.append({"record": record_id, "value_chunk": value, **{s.label: s.accuracy for s in scores}})
            out.write(json.dumps(rows[-1]) + "\n")
            out.flush()
    print("\n".join(f"{name}: {sum(r[name] for r in rows):.0f} of {len(rows)}" for name in modes))


if __name__ == "__main__":
    main()
