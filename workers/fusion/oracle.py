"""An analysis-only mode: recompute the tokens whose cached KV truly deviates most from a full prefill.

Not registered for serving: it runs a full prefill first to know the true deviation, so it is slower than
full prefill. It bounds what any choice of tokens to recompute can reach at a ratio
(bench/vllm_agreement_study.py); CacheBlend estimates the same ranking from one check layer.
"""
import torch

from workers.fusion.base import FusionMode
from workers.fusion.deviation import keep_top_spans, ratio_count
from workers.fusion.layer_feed import LayerFeed
from workers.fusion.layout import BlendLayout
from workers.fusion.selective_pass import PrefillResult, selective_prefill
from workers.kv_cache import KVCache
from workers.runner import ModelRunner


def kv_error(reference: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
    """Squared K and V error per token, summed over layers, heads and dims. # [L, 2, N, H_kv, D] x2 -> [N]"""
    return (reference.float() - cached.float()).pow(2).sum(dim=(0, 1, 3, 4))


def oracle_positions(error: torch.Tensor, forced: torch.Tensor, ratio: float, span_tokens: int) -> torch.Tensor:
    """Ascending positions: every forced one plus the ratio of the others with the largest error (in spans)."""
    positions = torch.arange(error.shape[0])
    num_keep = ratio_count(ratio, int((~forced).sum()))
    return positions[keep_top_spans(error, forced, num_keep, positions, span_tokens)]


class OracleSelection(FusionMode):
    """Full prefill for the true KV, then the selective pass over the chosen tokens at every layer."""

    name = "oracle"

    def prefill(
        self, runner: ModelRunner, layout: BlendLayout, cache: KVCache, ratio: float, feed: LayerFeed | None = None
    ) -> PrefillResult:
        if feed is None:
            layout.load_cached(cache, runner.rerotate_keys)
        else:
            for layer in range(runner.config.num_layers):
                feed.wait(layer)
        num_tokens = layout.kv_end
        reference = runner.new_cache(num_tokens)
        runner.forward(layout.token_ids[:num_tokens], reference, 0)
        error = kv_error(reference.data[:, :, :num_tokens], cache.data[:, :, :num_tokens])
        positions = oracle_positions(error, layout.forced, ratio, self.options.selection_span_tokens)
        return selective_prefill(runner, layout, cache, positions)
