"""Query-driven selection (after ProphetKV, Wang et al., ICML'26): recompute the tokens the question reads.

Two stages. First a scout: the question's tokens run through the layers over the assembled, re-rotated
cached context (their own K/V kept aside, never written to the cache), and every context token is scored by
the attention the question pays it. Then the selective pass recomputes the best-scoring tokens at every
layer. Ranking by relevance to the question instead of by KV deviation keeps globally salient but
irrelevant tokens from taking the budget (ProphetKV's "crowding-out"). Tokens whose cached KV is exact
(BlendLayout.exact_end: the prefix and, with chunk KV computed after it, the first chunk) are never chosen.
"""
from dataclasses import dataclass

import torch

from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.cacheblend import step_deviation
from workers.fusion.deviation import keep_top_spans, ratio_count
from workers.fusion.layer_feed import LayerFeed
from workers.fusion.layout import BlendLayout
from workers.fusion.selective_pass import LayerStep, PrefillResult, selective_prefill
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner

BUDGET_SPLITS = ("global", "per_chunk")


@dataclass(frozen=True, slots=True)
class QueryScoring:
    """How the question's attention ranks context tokens."""

    first_layer: int = 0  # attention of layers [first_layer, last_layer] counts
    last_layer: int | None = None  # None: the model's last layer
    layer_norm: bool = True  # each layer's attention over the selectable tokens sums to 1 before layers are added
    query_tokens: int | None = None  # the question's last N tokens score (None: all of its tokens)
    budget_split: str = "global"  # "per_chunk": every chunk recomputes the same share of its tokens
    with_deviation: bool = False  # also compute layer 0 in full; rank by relevance x deviation at the check layer

    def __post_init__(self) -> None:
        if self.first_layer < 0 or (self.last_layer is not None and self.last_layer < self.first_layer):
            raise ValueError(f"need 0 <= first_layer <= last_layer, got {self.first_layer}, {self.last_layer}")
        if self.query_tokens is not None and self.query_tokens < 1:
            raise ValueError(f"query_tokens must be >= 1 or None, got {self.query_tokens}")
        if self.budget_split not in BUDGET_SPLITS:
            raise ValueError(f"budget_split must be one of {BUDGET_SPLITS}, got {self.budget_split!r}")


class QueryDriven(FusionMode):
    """Score context tokens by the question's attention over the cached context; recompute the top ones."""

    name = "query_driven"
    reads_question = True

    def __init__(self, options: FusionOptions, scoring: QueryScoring | None = None) -> None:
        super().__init__(options)
        self.scoring = scoring if scoring is not None else QueryScoring()

    def prefill(
        self,
        runner: ModelRunner,
        layout: BlendLayout,
        cache: KVCache,
        recompute_ratio: float,
        feed: LayerFeed | None = None,
    ) -> PrefillResult:
        """The scout over the cached KV, then the selective pass over the chosen tokens."""
        if feed is None:
            layout.load_cached(cache, runner.rerotate_keys)
        relevance = self.relevance(runner, layout, cache, feed)
        if self.scoring.with_deviation:
            narrow = lambda step: self._narrow_by_deviation(step, relevance, recompute_ratio)  # noqa: E731
            return selective_prefill(runner, layout, cache, torch.arange(layout.kv_end), narrow, feed)
        return selective_prefill(runner, layout, cache, self.choose(layout, relevance, recompute_ratio), None, feed)

    def relevance(
        self, runner: ModelRunner, layout: BlendLayout, cache: KVCache, feed: LayerFeed | None
    ) -> torch.Tensor:
        """Per position below kv_end, the question's attention to it, combined over the scoring layers. # [kv_end]"""
        scoring = self.scoring
        last = (
            runner.config.num_layers - 1
            if scoring.last_layer is None
            else min(scoring.last_layer, runner.config.num_layers - 1)
        )
        per_layer = question_attention(runner, layout, cache, feed, last, scoring.query_tokens)  # [L', kv_end]
        per_layer = per_layer[scoring.first_layer :]
        if scoring.layer_norm:
            selectable = selectable_mask(layout)
            per_layer = per_layer / per_layer[:, selectable].sum(dim=1, keepdim=True).clamp_min(1e-30)
        return per_layer.sum(dim=0)

    def choose(self, layout: BlendLayout, relevance: torch.Tensor, recompute_ratio: float) -> torch.Tensor:
        """The positions the selective pass recomputes: the budget spent by the ranking. # [K]"""
        scores = self.ranking(layout, relevance)
        return select_tokens(
            scores, layout, recompute_ratio, self.options.selection_span_tokens, self.scoring.budget_split
        )

    def ranking(self, layout: BlendLayout, relevance: torch.Tensor) -> torch.Tensor:
        """The scores the budget is spent by: the question's attention itself. # [kv_end] -> [kv_end]"""
        return relevance

    def _narrow_by_deviation(
        self, step: LayerStep, relevance: torch.Tensor, recompute_ratio: float
    ) -> torch.Tensor | None:
        if step.layer != self.options.filter_layers[0]:
            return None
        deviation = step_deviation(step, self.options.deviation_metric)  # [S] = every position here
        score = relevance.to(deviation.device) * deviation
        return select_tokens(
            score, step.layout, recompute_ratio, self.options.selection_span_tokens, self.scoring.budget_split
        )


def selectable_mask(layout: BlendLayout) -> torch.Tensor:
    """Positions a selection may choose: reused (not forced) and past the exact leading segments. # [kv_end] bool"""
    selectable = ~layout.forced.clone()
    selectable[: layout.exact_end()] = False
    return selectable


def select_tokens(
    scores: torch.Tensor,
    layout: BlendLayout,
    recompute_ratio: float,
    span_tokens: int,
    budget_split: str,
    excluded: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ascending positions: the forced ones plus ratio x the reused tokens, best-scoring selectable ones first.

    The budget counts every reused token (as cacheblend's does), but is spent on selectable ones only;
    `excluded` positions are never chosen, not even inside a chosen span.
    scores: [kv_end], excluded: [kv_end] bool -> [K]
    """
    forced = layout.forced
    selectable = selectable_mask(layout)
    if excluded is not None:
        selectable &= ~excluded
    num_keep = min(ratio_count(recompute_ratio, int((~forced).sum())), int(selectable.sum()))
    scores = scores.float().masked_fill(~selectable, 0.0)
    positions = torch.arange(layout.kv_end)
    blocked = ~selectable  # never chosen on their own; inside a chosen span they come along
    if budget_split == "global":
        keep = keep_top_spans(scores, blocked, num_keep, positions, span_tokens)
        mask = torch.zeros_like(forced)
        mask[keep] = True
        return (mask & (selectable | forced)).nonzero().squeeze(1)
    mask = forced.clone()
    share = num_keep / max(int(selectable.sum()), 1)
    for seg in layout.chunk_segments():
        part = slice(seg.start, min(seg.end, layout.kv_end))
        free = selectable[part]
        if not bool(free.any()):
            continue
        kept = keep_top_spans(scores[part], ~free, ratio_count(share, int(free.sum())), positions[part], span_tokens)
        mask[part][kept] = True
    return (mask & (selectable | forced)).nonzero().squeeze(1)


@torch.inference_mode()
def question_attention(
    runner: ModelRunner,
    layout: BlendLayout,
    cache: KVCache,
    feed: LayerFeed | None,
    last_layer: int,
    query_tokens: int | None,
) -> torch.Tensor:
    """Attention the question's tokens pay each context token at layers 0..last_layer, over the cached KV.

    Summed over heads and question tokens. The question's own K/V join its attention (causally) but are never
    written to the cache; positions without cached KV (recomputed anyway) are left out and score 0.
    -> [last_layer + 1, kv_end] float32
    """
    question = layout.question
    scores = torch.zeros(last_layer + 1, layout.kv_end)
    if question is None:
        return scores
    cfg = runner.config
    context_end = question.start
    keys_at = _cached_positions(layout, context_end)  # [N] ascending
    if keys_at.numel() == 0:  # a cold request: every context token is recomputed, there is nothing to rank
        return scores
    q_positions = torch.arange(question.start, question.end)
    h = runner.embed(layout.token_ids[q_positions].to(runner.device))
    num_queries = q_positions.shape[0]
    counted = slice(0, num_queries) if query_tokens is None else slice(max(0, num_queries - query_tokens), num_queries)
    causal = torch.ones(num_queries, num_queries, dtype=torch.bool).tril()  # [Q, Q]
    contiguous = bool((keys_at == torch.arange(keys_at.shape[0])).all())  # the usual case: all context cached
    device_keys = slice(0, keys_at.shape[0]) if contiguous else keys_at.to(runner.device)
    for layer in range(last_layer + 1):
        q, k, v = runner.qkv(layer, h, q_positions)  # [Q, H, D], [Q, H_kv, D] x2
        if feed is not None:
            feed.wait(layer)
        own_visible, context_visible = causal, None
        window = cfg.layer_kind(layer).window_tokens  # a sliding-window layer: the last `window` keys only
        if window is not None:
            own_visible = causal & ((q_positions[:, None] - q_positions[None, :]) < window)
            context_visible = ((q_positions[:, None] - keys_at[None, :]) < window).to(runner.device)  # [Q, N]
        received, attn = scout_attention(
            q,
            k,
            v,
            cache.data[layer, 0, device_keys],
            cache.data[layer, 1, device_keys],
            own_visible.to(runner.device),
            cfg.attention_scale,
            context_visible,
            counted,
        )  # [N], [Q, H * D]
        h = runner.after_attention(layer, h, attn.to(h.dtype))
        scores[layer, keys_at] = received.to(scores.device)
    return scores


def scout_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context_k: torch.Tensor,
    context_v: torch.Tensor,
    own_visible: torch.Tensor,
    scale: float,
    context_visible: torch.Tensor | None = None,
    counted: slice = slice(None),
) -> tuple[torch.Tensor, torch.Tensor]:
    """The question's attention over the context's cached K/V and its own (causal), and what the context received.

    The two products with the context run in the cache's dtype (fp32 accumulation, as the engines' attention
    kernels do) and read the cache in place; the softmax is float32, over the context's logits and the
    question's own as one row without joining them, normalised in place: the [H, Q, N] weights are written
    once and never copied (concatenating and a plain softmax copied them three times a layer).
    q: [Q, H, D], k/v: [Q, H_kv, D], context_k/v: [N, H_kv, D], own_visible: [Q, Q] bool,
    context_visible: [Q, N] bool (None: every context key), scale: the logits' factor, counted: the queries whose
    weights are summed
    -> received [N] float32 (attention weight on each context key, summed over heads and counted queries),
       attention output [Q, H * D] float32
    """
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    dtype = context_k.dtype
    q_grouped = (q.float() * scale).reshape(num_queries, num_kv_heads, group, head_dim)
    q_grouped = q_grouped.permute(1, 2, 0, 3).reshape(num_kv_heads, group * num_queries, head_dim)  # [H_kv, G*Q, D]
    weights = torch.bmm(q_grouped.to(dtype), context_k.permute(1, 2, 0)).float()  # [H_kv, G*Q, N] logits
    if context_visible is not None:
        weights.masked_fill_(~context_visible.repeat(group, 1), float("-inf"))
    own = torch.bmm(q_grouped, k.float().permute(1, 2, 0))  # [H_kv, G*Q, Q]
    own.masked_fill_(~own_visible.repeat(group, 1), float("-inf"))
    top = torch.maximum(weights.amax(-1, keepdim=True), own.amax(-1, keepdim=True))  # finite: a query sees itself
    weights.sub_(top).exp_()
    own.sub_(top).exp_()
    total = weights.sum(-1, keepdim=True) + own.sum(-1, keepdim=True)  # [H_kv, G*Q, 1]
    weights.div_(total)  # the softmax over [context | own], context part
    own.div_(total)
    out = torch.bmm(weights.to(dtype), context_v.permute(1, 0, 2)).float()  # [H_kv, G*Q, D]
    out = out + torch.bmm(own, v.float().permute(1, 0, 2))
    out = out.reshape(num_kv_heads, group, num_queries, head_dim).permute(2, 0, 1, 3)  # [Q, H_kv, G, D]
    received = weights.view(num_kv_heads, group, num_queries, -1)[:, :, counted].sum(dim=(0, 1, 2))  # [N]
    return received, out.reshape(num_queries, num_heads * head_dim)


def _cached_positions(layout: BlendLayout, end: int) -> torch.Tensor:
    """Positions before `end` whose KV the cache holds (cached segments placed there). # [N] ascending"""
    parts = [torch.arange(s.start, min(s.end, end)) for s in layout.cached_segments() if s.start < end]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
