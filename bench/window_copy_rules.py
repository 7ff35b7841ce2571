"""Which chunks should read the windowed copy? Teacher-forced KL per record under three rules (Gemma 3).

Under `chunk_context: window_aware` a model with sliding-window layers keeps two copies of each chunk's KV (after
the prefix, and with the prefix hidden from those layers). Per record this scores full reuse and cacheblend at
r = 0.15 against full prefill's greedy answer with the torch runner, reading the windowed copy for:

- `prefix`: no chunk (the single copy `chunk_context: prefix` keeps);
- `window_aware`: the chunks `ChunkSources.read_at` picks (most of their tokens past the prefix's window);
- `but_last`: the same but the chunk right before the question, which the question's own windows read.
"""
import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workers.chunks.sources import PREFIX_INDEX, ChunkSource, ChunkSources
from workers.fuser import Fuser
from workers.generation.decode import greedy_answer
from workers.generation.divergence import teacher_forced_divergence
from workers.generation.prompt import PromptLayout
from workers.generation.teacher_forced import answer_logprobs
from workers.model.checkpoint import load_checkpoint
from workers.model.dtype import measured_on
from workers.model.runner import ModelRunner

RULES = ("prefix", "window_aware", "but_last")
MODES = (("full_reuse", 0.0), ("cacheblend", 0.15))


@dataclass(frozen=True, slots=True)
class ChosenSources(ChunkSources):
    """Read the windowed copy for exactly the chunks in `windowed`."""

    windowed: frozenset[int] = frozenset()

    def read_at(self, index: int, prompt: PromptLayout, namespace: str) -> ChunkSource:
        versions = self.versions(index == PREFIX_INDEX, prompt, namespace)
        return versions[-1] if index in self.windowed else versions[0]


def study_record(runner: ModelRunner, record: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """Each rule's teacher-forced KL at full reuse and cacheblend r = 0.15."""
    fuser = Fuser(runner, chunk_context="window_aware")
    prompt = fuser.layout([c["text"] for c in record["ctxs"]], record["question"])
    kv_end = len(prompt.token_ids) - len(prompt.suffix_ids)
    answer, _ = greedy_answer(runner, prompt.token_ids, max_new_tokens)
    targets = torch.tensor(answer)
    reference = answer_logprobs(fuser, prompt, "full_prefill", 1.0, answer, kv_end)
    fuser.precompute(prompt)
    picked = frozenset(i for i in range(len(prompt.chunk_ids)) if fuser.sources.read_at(i, prompt, "").hides_context)
    chosen = {"prefix": frozenset(), "window_aware": picked, "but_last": picked - {len(prompt.chunk_ids) - 1}}
    row: dict[str, Any] = {"id": record.get("id"), "prompt_tokens": len(prompt.token_ids), "windowed": sorted(picked)}
    for rule in RULES:
        fuser.sources = ChosenSources("window_aware", fuser.sources.window_tokens, chosen[rule])
        for mode, ratio in MODES:
            logprobs = answer_logprobs(fuser, prompt, mode, ratio, answer, kv_end)
            row[f"{rule}/{mode}"] = teacher_forced_divergence(reference, logprobs, targets).kl
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runner = ModelRunner(load_checkpoint(args.model, torch.float32))
    with open(args.data) as handle:
        records = [json.loads(line) for line in handle][args.offset : args.offset + args.limit]
    rows = []
    for record in records:
        rows.append(study_record(runner, record, args.max_new_tokens))
        print(json.dumps(rows[-1]), flush=True)
    keys = [f"{rule}/{mode}" for rule in RULES for mode, _ in MODES]
    summary = {key: {"mean": statistics.fmean(r[key] for r in rows), "median": statistics.median(r[key] for r in rows)}
               for key in keys}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**measured_on("float32"), "model": str(args.model), "data": str(args.data),
                                    "offset": args.offset, "records": len(rows), "summary": summary,
                                    "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
