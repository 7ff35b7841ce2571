"""Baseline: prefix caching, reusing only the longest previously seen prefix of the prompt."""
import torch

from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.baselines.prefix_block_cache import PrefixBlockCache, block_hashes
from workers.fusion.layer_feed import LayerFeed
from workers.fusion.layout import BlendLayout
from workers.fusion.selective_pass import PrefillResult, selective_prefill
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner


class PrefixCache(FusionMode):
    """Exact reuse of earlier prompts' KV from position 0 up to the first differing block."""

    name = "prefix_cache"
    reads_chunk_cache = False

    def __init__(self, options: FusionOptions) -> None:
        super().__init__(options)
        self.cache = PrefixBlockCache(options.prefix_cache.block_tokens, options.prefix_cache.num_blocks)

    def prefill(
        self,
        runner: ModelRunner,
        layout: BlendLayout,
        cache: KVCache,
        recompute_ratio: float,
        feed: LayerFeed | None = None,
    ) -> PrefillResult:
        """Load the matched prefix blocks, compute the rest, then remember this prompt's blocks."""
        # hashed once per request, over the tokens whose KV this pass computes
        hashes = block_hashes(layout.token_ids[: layout.kv_end].tolist(), self.cache.block_tokens)
        # The last token is always computed (it yields the logits), so only blocks before it may hit.
        blocks = self.cache.match(hashes[: (layout.kv_end - 1) // self.cache.block_tokens])
        num_hit = len(blocks) * self.cache.block_tokens
        if blocks:
            cache.data[:, :, :num_hit] = torch.cat(blocks, dim=2)
        layout.forced[:num_hit] = False
        result = selective_prefill(runner, layout, cache, self.initial(layout, recompute_ratio)[num_hit:])
        self.cache.insert(hashes, cache.data)
        return result
