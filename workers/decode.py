"""Autoregressive decoding on top of a filled KV cache."""
from collections.abc import Iterator

import torch

from workers.kv_cache import KVCache
from workers.runner import ModelRunner
from workers.sampling import SamplingParams, next_token


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
