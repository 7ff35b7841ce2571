"""Paired: a chat turn's TTFT with its prefix stored between turns against the same turn computing it.

On the vLLM engine in process (no HTTP, the serving default fusion), documents before the last question: each
conversation holds `--turns` turns over `--docs` musique passages with a system prompt, each answer fed back.
Every later turn runs twice, in alternating order, with vLLM's prefix cache cleared before each: once reading
the prefix the previous turn stored, once with that entry deleted so the pass computes it. Pairs come from
the same turn on the same machine moments apart, so the machine's drift cancels out of their ratio.

    PYTHONPATH=. .venv/bin/python bench/next_turn_prefix.py --out docs/results/chat/next_turn_prefix.json
"""
import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from bench.chat_turns import FOLLOW_UPS, SYSTEM_PROMPT
from cluster.bench.serve import cpu_model
from workers.engines.base import BlendRequest
from workers.evaluation.dataset import load_records
from workers.generation.conversation import Conversation
from workers.generation.sampling import SamplingParams, until_stop
from workers.generation.text_stream import answer_text
from workers.model.default import prepare_default_model
from workers.model.dtype import measured_on, resolve_dtype
from workers.vllm.settings import VLLMSettings

if TYPE_CHECKING:  # vLLM loads only when the benchmark runs
    from workers.vllm.engine import VLLMEngine

VARIANTS = ("stored", "computed")


def timed_turn(engine: "VLLMEngine", request: BlendRequest, variant: str) -> tuple[float, int, list[int]]:
    """One turn's worker TTFT, recomputed tokens and generated ids; `computed` first drops its stored prefix."""
    prompt = engine.fuser.layout(request.documents, request.question, request.conversation)
    if variant == "computed":
        engine.call(lambda: engine.fuser.store.delete(prompt.prefix_ids, [], request.namespace))
    engine.forget_fused_contexts()  # else the second run of a turn reads the first one's fused blocks
    generation = engine.open(request)
    generated = list(generation)  # the write-back stores the next turn's prefix (and a missed one) at the end
    return generation.stats.ttft_s, generation.stats.recomputed_tokens, generated


def conversation(engine: "VLLMEngine", documents: list[str], question: str, turns: int, max_tokens: int) -> list:
    """Per turn: each variant's TTFT and recomputed tokens (turn 1: stored only, nothing came before it)."""
    request = BlendRequest(documents, question, sampling=SamplingParams(max_new_tokens=max_tokens),
                           conversation=Conversation(SYSTEM_PROMPT))
    rows = []
    for index in range(turns):
        order = VARIANTS if index % 2 else VARIANTS[::-1]
        row: dict = {"turn": index + 1}
        for variant in order if index else ("stored",):
            ttft_s, recomputed, generated = timed_turn(engine, request, variant)
            row[variant] = {"ttft_s": ttft_s, "recomputed_tokens": recomputed}
        rows.append(row)
        answer = answer_text(engine.tokenizer, until_stop(generated, engine.stop_token_ids))
        request = replace(request, question=FOLLOW_UPS[index % len(FOLLOW_UPS)],
                          conversation=request.conversation.then(request.question, answer or "I do not know."))
    return rows


def summary(chats: list[list[dict]]) -> list[dict]:
    """Per turn: median TTFT of each variant, the median paired ratio, and each variant over turn 1's."""
    first = statistics.median(chat[0]["stored"]["ttft_s"] for chat in chats)
    rows = []
    for index in range(len(chats[0])):
        turns = [chat[index] for chat in chats]
        row = {"turn": index + 1}
        for variant in VARIANTS:
            if variant in turns[0]:
                median = statistics.median(t[variant]["ttft_s"] for t in turns)
                row[variant] = {
                    "ttft_s_median": median,
                    "ratio_to_turn_1": median / first,
                    "recomputed_tokens_mean": statistics.fmean(t[variant]["recomputed_tokens"] for t in turns),
                }
        if "computed" in turns[0]:
            row["stored_over_computed_median"] = statistics.median(
                t["stored"]["ttft_s"] / t["computed"]["ttft_s"] for t in turns
            )
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/musique_cacheblend.dev.jsonl"))
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--docs", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("docs/results/chat/next_turn_prefix.json"))
    args = parser.parse_args()
    from workers.vllm.engine import VLLMEngine

    model = prepare_default_model()
    dtype = resolve_dtype("auto", model)
    engine = VLLMEngine.start(model, Path(tempfile.mkdtemp(prefix="bs-turns-")), VLLMSettings(max_model_len=8192),
                              dtype)
    try:
        records = load_records(args.data, args.conversations + 1)
        chats = []
        for index, record in enumerate(records):
            documents = record.documents[: args.docs]
            engine.store_documents(documents)
            rows = conversation(engine, documents, record.question, args.turns, args.max_tokens)
            if index > 0:  # the first conversation warms the engine up, untimed
                chats.append(rows)
    finally:
        engine.close()
    document = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        **measured_on(dtype),
        "cpu_model": cpu_model(),
        "system_prompt": SYSTEM_PROMPT,
        "turns": summary(chats),
        "conversations": chats,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    for row in document["turns"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
