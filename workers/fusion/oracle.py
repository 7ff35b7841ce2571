"""Analysis-only modes: recompute the tokens whose cached KV deviates most from a full prefill's (heuristics).

Not registered for serving: each runs a full prefill first to know the true KV, so it is slower than full
prefill. None is a bound on what a choice of tokens can reach: they rank tokens by heuristics over the true
error, and which ranking best predicts the answer is what the study measures (bench/vllm_agreement_study.py).
- raw: squared K and V error summed over all layers (deep, high-norm layers dominate it);
- per_layer: each layer's error divided by that layer's mean first, so every layer counts alike;
- question: each layer's error weighted by the attention the question pays each token in the full prefill;
- iterative: per_layer in rounds; each round recomputes what was chosen so far and ranks the error left,
  which includes what recomputing the earlier choice did to the other tokens' fresh KV.
"""
import torch

from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.deviation import keep_top_spans, ratio_count
from workers.fusion.layer_feed import LayerFeed
from workers.fusion.layout import BlendLayout
from workers.fusion.query_driven import question_attention
from workers.fusion.selective_pass import PrefillResult, selective_prefill
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner

ORACLE_WEIGHTINGS = ("raw", "per_layer", "question", "iterative")


def kv_error(reference: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
    """Squared K and V error per token, summed over layers, heads and dims. # [L, 2, N, H_kv, D] x2 -> [N]"""
    return layer_kv_error(reference, cached).sum(dim=0)


def layer_kv_error(reference: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
    """Squared K and V error per layer and token. # [L, 2, N, H_kv, D] x2 -> [L, N]"""
    return (reference.float() - cached.float()).pow(2).sum(dim=(1, 3, 4))


def per_layer_normalised(error: torch.Tensor) -> torch.Tensor:
    """Each layer's error over its mean (layers with no error count 0), summed over layers. # [L, N] -> [N]"""
    return (error / error.mean(dim=1, keepdim=True).clamp_min(1e-30)).sum(dim=0)


def oracle_positions(
    error: torch.Tensor, forced: torch.Tensor, recompute_ratio: float, span_tokens: int
) -> torch.Tensor:
    """Ascending positions: every forced one plus the ratio of the others with the largest error (in spans)."""
    positions = torch.arange(error.shape[0])
    num_keep = ratio_count(recompute_ratio, int((~forced).sum()))
    return positions[keep_top_spans(error, forced, num_keep, positions, span_tokens)]


class OracleSelection(FusionMode):
    """Full prefill for the true KV, then the selective pass over the chosen tokens at every layer."""

    name = "oracle"

    def __init__(self, options: FusionOptions, weighting: str = "raw", rounds: int = 3) -> None:
        super().__init__(options)
        if weighting not in ORACLE_WEIGHTINGS:
            raise ValueError(f"weighting must be one of {ORACLE_WEIGHTINGS}, got {weighting!r}")
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        self.weighting = weighting
        self.rounds = rounds

    def prefill(
        self,
        runner: ModelRunner,
        layout: BlendLayout,
        cache: KVCache,
        recompute_ratio: float,
        feed: LayerFeed | None = None,
    ) -> PrefillResult:
        if feed is None:
            layout.load_cached(cache, runner.rerotate_keys)
        else:
            for layer in range(runner.config.num_layers):
                feed.wait(layer)
        num_tokens = layout.kv_end
        reference = runner.new_cache(num_tokens)
        runner.forward(layout.token_ids[:num_tokens], reference, 0)
        truth = reference.data[:, :, :num_tokens]
        error = layer_kv_error(truth, cache.data[:, :, :num_tokens])  # [L, N]
        span = self.options.selection_span_tokens
        if self.weighting == "iterative":
            return self._iterative(runner, layout, cache, truth, error, recompute_ratio)
        if self.weighting == "raw":
            score = error.sum(dim=0)
        elif self.weighting == "per_layer":
            score = per_layer_normalised(error)
        else:
            attention = question_attention(runner, layout, reference, None, runner.config.num_layers - 1, None)
            score = per_layer_normalised(error * attention)
        return selective_prefill(runner, layout, cache, oracle_positions(score, layout.forced, recompute_ratio, span))

    def _iterative(
        self,
        runner: ModelRunner,
        layout: BlendLayout,
        cache: KVCache,
        truth: torch.Tensor,
        error: torch.Tensor,
        recompute_ratio: float,
    ) -> PrefillResult:
        cached = cache.data.clone()  # the placed cached KV, restored before each round's pass
        chosen = layout.forced.clone()
        reusable = int((~layout.forced).sum())
        positions = torch.arange(layout.kv_end)
        result = None
        for round_index in range(1, self.rounds + 1):
            score = per_layer_normalised(error).masked_fill(chosen, 0.0)
            wanted = ratio_count(recompute_ratio * round_index / self.rounds, reusable) - int(
                (chosen & ~layout.forced).sum()
            )
            chosen[keep_top_spans(score, chosen, wanted, positions, self.options.selection_span_tokens)] = True
            cache.data.copy_(cached)
            result = selective_prefill(runner, layout, cache, chosen.nonzero().squeeze(1))
            error = layer_kv_error(truth, cache.data[:, :, : layout.kv_end])
        assert result is not None
        return result
