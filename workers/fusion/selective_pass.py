"""The one forward pass every fusion mode runs: recompute a shrinking token set layer by layer over cached KV."""
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workers.fusion.layer_feed import LayerFeed
from workers.fusion.layout import BlendLayout
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner


@dataclass(slots=True)
class LayerStep:
    """What a policy sees at one layer, before the fresh K/V overwrite the cached ones."""

    layer: int
    positions: torch.Tensor  # [S] the tokens recomputed at this layer, ascending
    q: torch.Tensor  # [S, H, D]
    k: torch.Tensor  # [S, H_kv, D] fresh
    v: torch.Tensor  # [S, H_kv, D] fresh
    cache: KVCache  # still holds the cached K/V at `positions`
    layout: BlendLayout


Narrowing = Callable[[LayerStep], torch.Tensor | None]
"""Given a layer's step, the indices into step.positions that stay recomputed past it (None keeps all)."""


@dataclass(slots=True)
class PrefillResult:
    """The last token's final hidden state and how much context was recomputed."""

    last_hidden: torch.Tensor  # [hidden]
    recomputed_token_layers: int  # context tokens x layers whose K/V were computed fresh
    num_context_tokens: int
    num_layers: int
    recompute_ratio: float | None = None  # the ratio the mode ended up using, when it raised the one asked for
    chunk_impacts: dict[int, float] = field(default_factory=dict)  # segment start -> impact the mode measured
    check_coverage: float | None = None  # cacheblend: share of the check layer's deviation its kept tokens held

    @property
    def recomputed_fraction(self) -> float:
        """Share of the context's per-layer KV that was recomputed rather than reused."""
        total = self.num_context_tokens * self.num_layers
        return self.recomputed_token_layers / total if total else 0.0


@torch.inference_mode()
def selective_prefill(
    runner: ModelRunner,
    layout: BlendLayout,
    cache: KVCache,
    positions: torch.Tensor,
    narrow: Narrowing | None = None,
    feed: LayerFeed | None = None,
) -> PrefillResult:
    """Run all layers for `positions` (ascending, narrowed on the way); others keep the KV in `cache`.

    With a `feed`, each layer's cached KV may still be arriving: the pass waits for it before reading it.
    """
    if int(layout.forced[positions].sum()) != int(layout.forced.sum()):
        raise ValueError("policy dropped tokens that must be recomputed (suffix or uncached)")
    num_context = layout.num_context_tokens
    last_layer = runner.config.num_layers - 1
    h = runner.embed(layout.token_ids[positions])
    work = 0
    for layer in range(runner.config.num_layers):
        q, k, v = runner.qkv(layer, h, positions)
        if feed is not None:
            feed.wait(layer)
        work += int((positions < num_context).sum())
        keep = narrow(LayerStep(layer, positions, q, k, v, cache, layout)) if narrow else None
        cache.write(layer, positions, k, v)
        if layer == last_layer:  # past the last layer's K/V only the last token's output is used
            keep = torch.tensor([positions.shape[0] - 1]) if keep is None else keep[-1:]
        if keep is not None:
            positions, h, q = positions[keep], h[keep], q[keep]
        h = runner.attend_and_mlp(layer, h, q, positions, cache)
    cache.length = max(cache.length, layout.kv_end)
    return PrefillResult(h[-1], work, num_context, runner.config.num_layers)
