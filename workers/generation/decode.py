"""Autoregressive decoding on top of a filled KV cache."""
from collections.abc import Iterator

import torch

from workers.generation.sampling import SamplingParams, next_token
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner


@torch.inference_mode()
def iter_decode(
    runner: ModelRunner, cache: KVCache, first_logits: torch.Tensor, params: SamplingParams
) -> Iterator[int]:
    """Yield generated token ids until a stop token (yielded, then stop) or max_new_tokens."""
    generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    logits = first_logits
    for step in range(params.max_new_tokens):
        token = next_token(logits, params, generator)
        yield token
        if token in params.stop_token_ids or step + 1 == params.max_new_tokens:
            return
        h = runner.forward(torch.tensor([token]), cache, cache.length)
        logits = runner.logits(h)[-1]


@torch.inference_mode()
def greedy_answer(runner: ModelRunner, token_ids: list[int], max_new_tokens: int) -> tuple[list[int], KVCache]:
    """Full prefill of a prompt, then max_new_tokens greedy tokens (no stop token); the answer and its cache."""
    cache = runner.new_cache(len(token_ids) + max_new_tokens)
    hidden = runner.forward(torch.tensor(token_ids, device=runner.device), cache, 0)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    return list(iter_decode(runner, cache, runner.logits(hidden[-1:])[-1], params)), cache
