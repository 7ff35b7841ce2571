"""What a sliding-window layer sees when a chunk's KV is computed after the prompt prefix (Gemma 3).

On Gemma 3 a local layer's query sees the last 512 tokens. Deep in a fused context a chunk's tokens see the
previous chunk's tail there, never the prompt prefix or the BOS token (the attention sink), yet the chunk's
cached KV was computed right after the prefix, where they see both. This study computes each chunk's KV in
three ways and scores full reuse (every chunk's cached KV moved into place, nothing recomputed) against full
prefill, with the model's own runner (torch, float32 by default):

- `prefix`: the chunk after the prefix, as the store's first copy (under `--chunk-context prefix` the row's
  fuser full_reuse KL is a little lower than this one's: the fuser recomputes the context's last token too);
- `placed`: the same, but at sliding-window layers a chunk token sees a prefix token only where it would at
  its place in the fused context (within the window of its position there): the prefix as the context shows it;
- `placed_bos`: only the BOS token (position 0, the attention sink) is hidden as `placed` says.

The fuser's own full_reuse runs under `--chunk-context` (`window_aware`, the default, reads a chunk from the copy
computed with the prefix hidden from local layers wherever most of its tokens lie past the prefix's window).

Per record: first-token KL and the teacher-forced KL along full prefill's greedy answer, and each layer kind's
relative KV error of the reused context against full prefill's.
"""
import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from workers.chunks.kv import forward_hiding_context
from workers.chunks.sources import CHUNK_CONTEXTS, DEFAULT_CHUNK_CONTEXT, ChunkSources
from workers.fuser import Fuser
from workers.generation.decode import greedy_answer
from workers.generation.divergence import teacher_forced_divergence
from workers.generation.teacher_forced import answer_logprobs
from workers.model.checkpoint import load_checkpoint
from workers.model.dtype import DTYPE_CHOICES, measured_on, resolve_dtype, torch_dtype
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner

VARIANTS = ("prefix", "placed", "placed_bos")


@torch.inference_mode()
def chunk_kv(
    runner: ModelRunner, context_ids: list[int], chunk_ids: list[int], variant: str, place: int
) -> torch.Tensor:
    """A chunk's K/V computed after `context_ids`, the context hidden from it at local layers as `variant` says.

    `place`: the position of the chunk's first token in the fused context. -> [L, 2, n, H_kv, D]
    """
    num_context = len(context_ids)
    ids = torch.tensor(context_ids + chunk_ids, device=runner.device)
    cache = runner.new_cache(ids.shape[0])
    hidden = torch.zeros(len(chunk_ids), num_context, dtype=torch.bool, device=runner.device)
    window = ChunkSources.for_model("window_aware", runner.config).window_tokens  # Gemma 3: every local layer's
    if window is not None and variant != "prefix":
        at_place = torch.arange(len(chunk_ids), device=runner.device) + place  # the chunk tokens' fused positions
        unseen = (at_place[:, None] - torch.arange(num_context, device=runner.device)[None, :]) >= window
        columns = slice(0, num_context) if variant == "placed" else slice(0, 1)
        hidden[:, columns] = unseen[:, columns]
    forward_hiding_context(runner, ids, cache, hidden)
    return cache.data[:, :, num_context:].clone()


@torch.inference_mode()
def reused_cache(runner: ModelRunner, prefix_ids: list[int], chunks: list[list[int]], full: KVCache,
                 capacity: int, variant: str) -> KVCache:
    """The prefix's exact KV (from full prefill), then each chunk's KV computed as `variant` says, moved into place."""
    cache = runner.new_cache(capacity)
    start = len(prefix_ids)
    cache.data[:, :, :start] = full.data[:, :, :start]
    for ids in chunks:
        kv = chunk_kv(runner, prefix_ids, ids, variant, start)  # [L, 2, n, H_kv, D]
        for layer in range(runner.config.num_layers):
            kv[layer, 0] = runner.rerotate_keys(layer, kv[layer, 0], start - len(prefix_ids))
        cache.data[:, :, start : start + len(ids)] = kv
        start += len(ids)
    return cache


@torch.inference_mode()
def logprobs_over(runner: ModelRunner, cache: KVCache, rest_ids: list[int], start: int) -> torch.Tensor:
    """Next-token log-probs after each of `rest_ids` (question then answer but its last), over the cache. # [A, V]"""
    hidden = runner.forward(torch.tensor(rest_ids, device=runner.device), cache, start)
    return runner.logits(hidden).log_softmax(dim=-1).cpu()


@torch.inference_mode()
def study_record(fuser: Fuser, record: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """Full prefill's answer, then full reuse under each variant: KLs and per-layer-kind KV error."""
    runner = fuser.runner
    documents = [c["text"] for c in record["ctxs"]]
    prompt = fuser.layout(documents, record["question"])
    kv_end = len(prompt.prefix_ids) + sum(len(ids) for ids in prompt.chunk_ids)
    capacity = len(prompt.token_ids) + max_new_tokens
    answer, full = greedy_answer(runner, prompt.token_ids, max_new_tokens)
    full_kv = full.data[:, :, :kv_end].clone()
    question = prompt.token_ids[kv_end:]
    reference = logprobs_over(runner, clone_prefix(runner, full, kv_end, capacity), question + answer[:-1], kv_end)
    reference = reference[len(question) - 1 :]
    targets = torch.tensor(answer)
    local = [i for i in range(runner.config.num_layers) if runner.config.layer_kind(i).window_tokens is not None]
    row: dict[str, Any] = {"id": record.get("id"), "context_tokens": kv_end, "chunks": len(prompt.chunk_ids)}
    for variant in VARIANTS:
        cache = reused_cache(runner, prompt.prefix_ids, prompt.chunk_ids, full, capacity, variant)
        squares = (1, 2, 3, 4)
        error = (cache.data[:, :, :kv_end] - full_kv).float().pow(2).sum(squares) / full_kv.float().pow(2).sum(squares)
        logprobs = logprobs_over(runner, cache, question + answer[:-1], kv_end)[len(question) - 1 :]
        divergence = teacher_forced_divergence(reference, logprobs, targets)
        first = float((reference[0].exp() * (reference[0] - logprobs[0])).sum())
        row[variant] = {
            "first_token_kl": first, "tf_kl": divergence.kl,
            "kv_error_local": statistics.fmean(float(error[i]) for i in local),
            "kv_error_global": statistics.fmean(
                float(error[i]) for i in range(runner.config.num_layers) if i not in local
            ),
        }
    fuser.precompute(prompt)  # the store's own chunk KV: `prefix` must score as the fuser's full_reuse does
    fuser_logprobs = answer_logprobs(fuser, prompt, "full_reuse", 0.0, answer, kv_end)
    row["full_reuse_tf_kl"] = teacher_forced_divergence(reference, fuser_logprobs, targets).kl
    return row


def clone_prefix(runner: ModelRunner, full: KVCache, end: int, capacity: int) -> KVCache:
    """A cache holding the first `end` positions of `full`."""
    cache = runner.new_cache(capacity)
    cache.data[:, :, :end] = full.data[:, :, :end]
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32")
    parser.add_argument("--chunk-context", choices=CHUNK_CONTEXTS, default=DEFAULT_CHUNK_CONTEXT)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dtype = resolve_dtype(args.dtype, args.model, on_gpu=False)
    fuser = Fuser(ModelRunner(load_checkpoint(args.model, torch_dtype(dtype))), chunk_context=args.chunk_context)
    with open(args.data) as handle:
        records = [json.loads(line) for line in handle][args.offset : args.offset + args.limit]
    rows = []
    for record in records:
        rows.append(study_record(fuser, record, args.max_new_tokens))
        print(json.dumps(rows[-1]), flush=True)
    summary = {
        variant: {metric: statistics.fmean(row[variant][metric] for row in rows) for metric in rows[0][variant]}
        for variant in VARIANTS
    }
    summary["full_reuse_tf_kl"] = statistics.fmean(row["full_reuse_tf_kl"] for row in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**measured_on(dtype), "model": str(args.model), "data": str(args.data),
                                    "chunk_context": args.chunk_context, "offset": args.offset, "records": len(rows),
                                    "summary": summary, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
