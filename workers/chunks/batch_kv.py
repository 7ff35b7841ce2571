"""Several chunks' KV in one forward pass: the chunks packed after one shared context, each attending to it alone.

Packing runs the linear layers (most of a small model's FLOPs) on every chunk's tokens at once, where one
pass per chunk would leave a short matmul to each; attention stays per chunk, so no chunk sees another.
"""
from collections.abc import Sequence

import torch

from workers.chunks.kv import ChunkKV
from workers.model.layers import causal_attention, masked_attention, visible_keys
from workers.model.runner import ModelRunner

DEFAULT_BATCH_TOKENS = 4096  # tokens per packed pass: past this the per-chunk gain levels off on CPU


def token_batches(lengths: Sequence[int], context_tokens: int, max_batch_tokens: int) -> list[list[int]]:
    """Indices of parts grouped in order, each group's parts plus the context within `max_batch_tokens`.

    A part too long to share a pass with another goes alone (its pass is as long as it needs).
    """
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    batches: list[list[int]] = []
    used = context_tokens
    for index, length in enumerate(lengths):
        if batches and used + length <= max_batch_tokens:
            batches[-1].append(index)
            used += length
        else:
            batches.append([index])
            used = context_tokens + length
    return batches


@torch.inference_mode()
def compute_chunks_kv(
    runner: ModelRunner,
    parts: Sequence[Sequence[int]],
    context_ids: Sequence[int] = (),
    hide_context_at_windows: bool = False,
    max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
) -> list[ChunkKV]:
    """Each part's KV computed after `context_ids` (as `compute_chunk_kv` computes one), several per pass."""
    chunks: list[ChunkKV] = []
    for batch in token_batches([len(p) for p in parts], len(context_ids), max_batch_tokens):
        chunks += _packed_pass(runner, [list(parts[i]) for i in batch], list(context_ids), hide_context_at_windows)
    return chunks


def _packed_pass(
    runner: ModelRunner, parts: list[list[int]], context_ids: list[int], hide_context_at_windows: bool
) -> list[ChunkKV]:
    """One forward pass over context + parts: each part at positions len(context).., seeing the context and itself."""
    cfg, device = runner.config, runner.device
    num_context = len(context_ids)
    ids = torch.tensor(context_ids + [t for part in parts for t in part], dtype=torch.long, device=device)
    bounds = [num_context]
    for part in parts:
        bounds.append(bounds[-1] + len(part))
    positions = torch.cat(
        [torch.arange(num_context)] + [torch.arange(num_context, num_context + len(p)) for p in parts]
    ).to(device)
    kv = torch.empty(cfg.num_layers, 2, ids.shape[0], cfg.num_kv_heads, cfg.head_dim, dtype=runner.dtype, device=device)
    longest = max(len(p) for p in parts)
    windows = {cfg.layer_kind(layer).window_tokens for layer in range(cfg.num_layers)}
    masks = {w: _part_mask(num_context, longest, w, hide_context_at_windows, device) for w in windows}
    h = runner.embed(ids)
    for layer in range(cfg.num_layers):
        q, k, v = runner.qkv(layer, h, positions)
        kv[layer, 0], kv[layer, 1] = k, v
        window = cfg.layer_kind(layer).window_tokens
        scale = cfg.attention_scale
        outputs = [causal_attention(q[:num_context], k[:num_context], v[:num_context], scale, window)] \
            if num_context else []
        for start, end in zip(bounds[:-1], bounds[1:]):
            keys = torch.cat([k[:num_context], k[start:end]])
            values = torch.cat([v[:num_context], v[start:end]])
            mask = masks[window][: end - start, : num_context + end - start]
            outputs.append(masked_attention(q[start:end], keys, values, mask, scale))
        h = runner.after_attention(layer, h, torch.cat(outputs))
    return [
        ChunkKV(part, kv[:, :, start:end].clone(), base_position=num_context)
        for part, start, end in zip(parts, bounds[:-1], bounds[1:])
    ]


def _part_mask(
    num_context: int, num_tokens: int, window: int | None, hide_context: bool, device: torch.device
) -> torch.Tensor:
    """Which keys (the context's, then the part's own) a part's queries see, for a part of up to `num_tokens`.

    [num_tokens, num_context + num_tokens] bool; a shorter part takes its top-left corner.
    """
    queries = torch.arange(num_context, num_context + num_tokens, device=device)
    keys = torch.cat([torch.arange(num_context, device=device), queries])
    mask = visible_keys(queries, keys, window)
    if hide_context and window is not None:
        mask[:, :num_context] = False  # as deep in a long prompt: the window has left the context behind
    return mask
