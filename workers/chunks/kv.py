"""A chunk's KV cache computed once, to be reused wherever the chunk appears in a prompt."""
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from workers.model.kv_cache import KVCache
from workers.model.layers import masked_attention, visible_keys
from workers.model.runner import ModelRunner


@dataclass(slots=True)
class ChunkKV:
    """K and V of a chunk's tokens; K rotated for positions base_position..base_position+T-1."""

    token_ids: list[int]
    kv: torch.Tensor  # [L, 2, T, H_kv, D]
    base_position: int = 0
    source_tier: str = "computed"  # where a store found it; "computed" for KV made here

    def __post_init__(self) -> None:
        if self.kv.dim() != 5 or self.kv.shape[1] != 2 or self.kv.shape[2] != len(self.token_ids):
            raise ValueError(f"chunk KV shape {tuple(self.kv.shape)} does not match {len(self.token_ids)} tokens")

    @property
    def num_tokens(self) -> int:
        """How many tokens the chunk holds."""
        return len(self.token_ids)


@dataclass(slots=True)
class ChunkLayers:
    """A cached chunk read layer by layer: K rotated for base_position.., each layer `[2, T, H_kv, D]` in order."""

    token_ids: list[int]
    layers: Iterator[torch.Tensor]
    num_layers: int
    base_position: int = 0
    source_tier: str = "computed"
    impact: float | None = None  # the chunk's context impact as the store knows it from earlier uses, if any
    variant_score: float = 0.0  # read from a variant: how well its preceding chunks fit the request's (0: base KV)

    @property
    def num_tokens(self) -> int:
        """How many tokens the chunk holds."""
        return len(self.token_ids)

    @classmethod
    def of(cls, chunk: ChunkKV) -> "ChunkLayers":
        """The layers of a chunk already in memory."""
        return cls(chunk.token_ids, iter(chunk.kv), chunk.kv.shape[0], chunk.base_position, chunk.source_tier)


@torch.inference_mode()
def compute_chunk_kv(
    runner: ModelRunner, token_ids: list[int], context_ids: list[int] = (), hide_context_at_windows: bool = False
) -> ChunkKV:
    """Prefill the chunk alone (or after `context_ids`) and keep only the chunk's own KV.

    With `hide_context_at_windows`, the chunk's queries at sliding-window layers see none of the context (as deep
    in a long prompt, where the window has left it behind); its global layers still see it.
    """
    ids = torch.tensor(list(context_ids) + list(token_ids), dtype=torch.long)
    cache = runner.new_cache(len(ids))
    start = len(context_ids)
    if hide_context_at_windows and start:
        hidden = torch.ones(len(token_ids), start, dtype=torch.bool, device=runner.device)
        forward_hiding_context(runner, ids, cache, hidden)
    else:
        runner.forward(ids, cache, 0)
    return ChunkKV(list(token_ids), cache.data[:, :, start:].clone(), base_position=start)


def forward_hiding_context(runner: ModelRunner, ids: torch.Tensor, cache: KVCache, hidden: torch.Tensor) -> None:
    """Prefill ids from position 0; at sliding-window layers the tokens after the context miss the keys `hidden` marks.

    ids: [T] (context then chunk); hidden: [T - num_context, num_context] bool, True where a chunk token's query
    must not see a context key.
    """
    cfg, num_context = runner.config, hidden.shape[1]
    positions = torch.arange(ids.shape[0], device=runner.device)
    h = runner.embed(ids.to(runner.device))
    for layer in range(cfg.num_layers):
        q, k, v = runner.qkv(layer, h, positions)
        cache.write(layer, positions, k, v)
        window = cfg.layer_kind(layer).window_tokens
        mask = visible_keys(positions, positions, window)  # [T, T]
        if window is not None:
            mask[num_context:, :num_context] &= ~hidden
        h = runner.after_attention(layer, h, masked_attention(q, k, v, mask, cfg.attention_scale))
    cache.length = ids.shape[0]
