"""Multi-turn chats through HTTP: does every turn reuse the documents' KV, and is a later turn's TTFT no higher?

Starts `blendserve serve` (vLLM engine, the default configuration otherwise) on a local Ray, stores each
conversation's documents through `POST /v1/documents` (a deployment that ingested its corpus), then holds
conversations of `--turns` turns over `--docs` musique passages with a system prompt: the first question is the
record's, the later ones follow-ups; each answer goes back as the assistant's turn. Streams every turn and
records the client's TTFT (first content chunk) and the `blend` stats. One conversation first, untimed.

    .venv/bin/python bench/chat_turns.py --conversations 6 --documents-at last --work-dir /tmp/bs/chat
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from cluster.bench.serve import cpu_model
from cluster.bench.systems import EngineShape, blendserve_server
from workers.evaluation.dataset import load_records
from workers.generation.conversation import DOCUMENT_PLACES
from workers.model.default import prepare_default_model
from workers.model.dtype import measured_on, resolve_dtype

SYSTEM_PROMPT = "You are a research assistant. Answer from the passages, in a few words."
FOLLOW_UPS = (
    "Which passage says so?",
    "What else do the passages say about it?",
    "Is there a date in those passages?",
    "Summarise the answer in three words.",
)
MODEL = "SmolLM2-135M-Instruct"


def turn(client: openai.OpenAI, messages: list[dict[str, str]], documents: list[str], max_tokens: int) -> dict:
    """One streamed turn: its text, the client's TTFT and the closing chunk's `blend` stats and usage."""
    start_s = time.perf_counter()
    first_s, text, blend, usage = None, "", None, None
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
        extra_body={"documents": [{"text": d} for d in documents]},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first_s = first_s or time.perf_counter() - start_s
            text += chunk.choices[0].delta.content
        blend = (chunk.model_extra or {}).get("blend") or blend
        usage = chunk.usage or usage
    return {"text": text, "client_ttft_s": first_s, "blend": blend, "prompt_tokens": usage.prompt_tokens}


def conversation(client: openai.OpenAI, documents: list[str], question: str, turns: int, max_tokens: int) -> list:
    """A chat of `turns` turns over `documents`, each answer fed back as the assistant's message."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    rows = []
    for index in range(turns):
        row = turn(client, messages, documents, max_tokens)
        rows.append(row)
        if index + 1 < turns:
            messages += [{"role": "assistant", "content": row["text"] or "I do not know."},
                         {"role": "user", "content": FOLLOW_UPS[index % len(FOLLOW_UPS)]}]
    return rows


def summary(chats: list[list[dict[str, Any]]], chunk_tokens: list[int]) -> list[dict[str, Any]]:
    """Per turn: median client and worker TTFT, their ratio to turn 1's, and where the reused tokens came from."""
    rows = []
    for index in range(len(chats[0])):
        turns = [chat[index] for chat in chats]
        tiers: dict[str, int] = {}
        for row in turns:
            for tier, count in row["blend"]["reused_tokens"].items():
                tiers[tier] = tiers.get(tier, 0) + count
        rows.append({
            "turn": index + 1,
            "client_ttft_s_median": statistics.median(r["client_ttft_s"] for r in turns),
            "worker_ttft_s_median": statistics.median(r["blend"]["ttft_s"] for r in turns),
            "prompt_tokens_mean": statistics.fmean(r["prompt_tokens"] for r in turns),
            "reused_tokens_by_tier": tiers,
            "every_chunk_reused": all(
                sum(r["blend"]["reused_tokens"].values()) >= tokens for r, tokens in zip(turns, chunk_tokens)
            ),
            "plans": sorted({r["blend"]["plan"] for r in turns}),
        })
    for row in rows:
        row["client_ttft_ratio_to_turn_1"] = row["client_ttft_s_median"] / rows[0]["client_ttft_s_median"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/musique_cacheblend.dev.jsonl"))
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--docs", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: docs/results/chat/turns_documents_<documents-at>.json")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/bs/chat"))
    parser.add_argument("--documents-at", choices=DOCUMENT_PLACES, default="last",
                        help="prompt.documents_at: before the conversation or before its last question")
    args = parser.parse_args()
    out = args.out or Path(f"docs/results/chat/turns_documents_{args.documents_at}.json")
    model = prepare_default_model()
    shape = EngineShape(model, MODEL, resolve_dtype("auto", model))
    records = load_records(args.data, args.conversations + 1)
    chats, chunk_tokens = [], []
    with blendserve_server(shape, args.work_dir, {"prompt": {"documents_at": args.documents_at}}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        for index, record in enumerate(records):
            documents = record.documents[: args.docs]
            stored = httpx.post(f"{url}/v1/documents", json={"documents": [{"text": d} for d in documents]},
                                timeout=600).json()["data"]
            rows = conversation(client, documents, record.question, args.turns, args.max_tokens)
            if index > 0:  # the first conversation warms the server up, untimed
                chats.append(rows)
                chunk_tokens.append(sum(d["num_tokens"] for d in stored))
    document = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        **measured_on(shape.dtype),
        "cpu_model": cpu_model(),
        "system_prompt": SYSTEM_PROMPT,
        "documents_at": args.documents_at,
        "turns": summary(chats, chunk_tokens),
        "conversations": chats,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    for row in document["turns"]:
        print(json.dumps({k: v for k, v in row.items() if k != "reused_tokens_by_tier"}))


if __name__ == "__main__":
    main()
