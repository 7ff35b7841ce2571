"""Cache-Craft (Agarwal et al., SIGMOD'25): per-chunk Cache Context Impact picks reuse, selective or full recompute.

Three mechanisms, each switchable in FusionOptions:

- chunk impact (CCI): at the first filter layer, the share of a chunk's attention that goes to the chunks
  before it sets how much of it is recomputed (none below cci_reuse_below, all above cci_full_above, else a
  share in proportion, its tokens ranked by KV deviation);
- stored impact (craft.stored_impact): a chunk whose impact the store already holds (a running mean over
  its earlier uses, ChunkLayers.impact) and needs no recompute is computed at no layer at all; when every
  chunk's impact is stored, the plan is made up front: no layer is computed for every token, each chunk's
  share follows its stored impact and its tokens are the spans the question reads most (a scout over all
  layers, as query_driven's); such a pass measures no impact, so the stored means are not refined by it;
- early termination (craft.stop_after): a scout runs the question over the cached context up to that layer;
  past it, the chunks the question barely attends to keep their cached KV;
- variants (workers/chunks/variants.py, when the Fuser keeps them): a chunk read from a variant computed after
  preceding chunks that overlap this request's by a score s counts its impact x (1 - s);
- placement (craft.placement): each chunk's share inside it (the paper's), or the shares pooled and spent where
  the question reads (the scout then runs over all layers, and its attention ranks tokens online too).

Tokens whose cached KV is exact (BlendLayout.exact_end) are never recomputed.
"""
import math
from dataclasses import dataclass

import torch

from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.cacheblend import step_deviation
from workers.fusion.craft_placement import PLACEMENTS
from workers.fusion.layer_feed import LayerFeed
from workers.fusion.layout import BlendLayout, Segment
from workers.fusion.query_driven import question_attention
from workers.fusion.selective_pass import LayerStep, PrefillResult, selective_prefill
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner


@dataclass(slots=True)
class CraftPlan:
    """What the mode knows of one request's chunks before the pass."""

    chunks: list[Segment]
    stored: list[float | None]  # per chunk: its impact known before the pass (0 for exact chunks), else None
    unfocused: torch.Tensor  # [kv_end] bool: reusable positions of chunks the question barely attends to
    measured: dict[int, float]  # segment start -> impact measured online at the filter layer (filled by the pass)
    relevance: torch.Tensor | None = None  # [kv_end] the question's attention over all layers, where scouted
    upfront: bool = False  # every chunk's impact stored: the plan is made before the pass


class CacheCraft(FusionMode):
    """At the first filter layer, chunks the context barely reaches are reused, strongly reached ones recomputed."""

    name = "cachecraft"
    reads_question = True

    def __init__(self, options: FusionOptions) -> None:
        super().__init__(options)
        self.place = PLACEMENTS[options.craft.placement]
        self.scout_all_layers = options.craft.placement == "pooled"  # pooled shares go where the question reads

    def prefill(
        self,
        runner: ModelRunner,
        layout: BlendLayout,
        cache: KVCache,
        recompute_ratio: float,
        feed: LayerFeed | None = None,
    ) -> PrefillResult:
        """Plan from stored impacts and the question's scout, then the selective pass; reports measured impacts."""
        if feed is None:
            layout.load_cached(cache, runner.rerotate_keys)
        plan = self.plan(runner, layout, cache, feed)
        initial = self.upfront(layout, plan, recompute_ratio) if plan.upfront else self.initial_positions(layout, plan)
        result = selective_prefill(
            runner, layout, cache, initial, lambda step: self._narrow(step, recompute_ratio, plan), feed
        )
        result.chunk_impacts = dict(plan.measured)
        return result

    def plan(self, runner: ModelRunner, layout: BlendLayout, cache: KVCache, feed: LayerFeed | None) -> CraftPlan:
        """Stored impacts of the request's chunks and (early termination on) the chunks out of the question's focus."""
        opts = self.options
        chunks = layout.chunk_segments()
        exact = layout.exact_end()
        stored: list[float | None] = [
            0.0 if seg.end <= exact else (seg.cached.impact if opts.craft.stored_impact and seg.cached else None)
            for seg in chunks
        ]
        unfocused = torch.zeros(layout.kv_end, dtype=torch.bool)
        stop = opts.craft.stop_after
        upfront = opts.craft.stored_impact and bool(chunks) and all(impact is not None for impact in stored)
        all_layers = upfront or self.scout_all_layers
        if layout.question is None or not chunks or (stop is None and not all_layers):
            return CraftPlan(chunks, stored, unfocused, {})
        last = runner.config.num_layers - 1 if all_layers or stop is None else min(stop, runner.config.num_layers - 1)
        attention = question_attention(runner, layout, cache, feed, last, None)  # [last + 1, kv_end]
        if stop is not None:
            for seg, share in zip(chunks, chunk_focus(attention[: stop + 1], chunks).tolist()):
                if share < opts.craft.focus_below:
                    unfocused[seg.start : min(seg.end, layout.kv_end)] = True
            unfocused &= ~layout.forced
        relevance = (attention / attention.sum(dim=1, keepdim=True).clamp_min(1e-30)).sum(dim=0) if all_layers else None
        return CraftPlan(chunks, stored, unfocused, {}, relevance, upfront)

    def upfront(self, layout: BlendLayout, plan: CraftPlan, recompute_ratio: float) -> torch.Tensor:
        """With every chunk's impact stored: each chunk's share by its impact, the question's most read spans. # [S]"""
        assert plan.relevance is not None
        impacts = [impact or 0.0 for impact in plan.stored]
        mean_impact = (sum(impacts) / len(impacts)) or 1.0
        exact = layout.exact_end()
        shares = [
            0.0 if seg.end <= exact else self.chunk_ratio(impact, seg, recompute_ratio, mean_impact)
            for seg, impact in zip(plan.chunks, impacts)
        ]
        keep = layout.forced | self.place(plan.relevance, plan.chunks, shares, self.options.selection_span_tokens)
        return keep.nonzero().squeeze(1)

    def chunk_ratio(self, impact: float, seg: Segment, recompute_ratio: float, mean_impact: float) -> float:
        """Share of a chunk to recompute: none below cci_reuse_below, all above cci_full_above, else in proportion.

        A chunk read from a variant that fits the request by s counts its impact x (1 - s).
        """
        cci = impact * (1.0 - (seg.cached.variant_score if seg.cached is not None else 0.0))
        craft = self.options.craft
        return chunk_share(cci, recompute_ratio, mean_impact, craft.cci_reuse_below, craft.cci_full_above)

    def initial_positions(self, layout: BlendLayout, plan: CraftPlan) -> torch.Tensor:
        """Every position but the exact ones and those of chunks whose stored impact needs no recompute. # [S]"""
        skip = torch.zeros(layout.kv_end, dtype=torch.bool)
        skip[: layout.exact_end()] = True
        for seg, impact in zip(plan.chunks, plan.stored):
            if impact is not None and impact < self.options.craft.cci_reuse_below:
                skip[seg.start : min(seg.end, layout.kv_end)] = True
        return (~skip | layout.forced).nonzero().squeeze(1)

    def _narrow(self, step: LayerStep, recompute_ratio: float, plan: CraftPlan) -> torch.Tensor | None:
        opts = self.options
        alive = torch.zeros(step.layout.kv_end, dtype=torch.bool)
        alive[step.positions] = True
        before = int(alive.sum())
        if step.layer == opts.filter_layers[0] and not plan.upfront:
            alive &= self._select(step, recompute_ratio, plan)
        if step.layer == opts.craft.stop_after:
            alive &= ~plan.unfocused
        if int(alive.sum()) == before:
            return None
        return alive[step.positions].nonzero().squeeze(1)

    def _select(self, step: LayerStep, recompute_ratio: float, plan: CraftPlan) -> torch.Tensor:
        """Positions kept past the filter layer: forced ones plus each chunk's share by its impact. # [kv_end] bool

        Tokens are ranked by the question's attention where the plan scouted it over all layers, else by KV
        deviation one token at a time (the paper's rule).
        """
        opts = self.options
        layout = step.layout
        present = torch.zeros(layout.kv_end, dtype=torch.bool)
        present[step.positions] = True
        online = [i for i, seg in enumerate(plan.chunks) if bool(present[seg.start : seg.end].all())]
        if not online:
            return layout.forced.clone()
        q, k = full_layer_qk(step)
        measured = chunk_context_impact(q, k, plan.chunks, opts.craft.cci_sample_queries, online)
        impacts = [float(measured[i]) if i in online else plan.stored[i] for i in range(len(plan.chunks))]
        for i in online:
            plan.measured[plan.chunks[i].start] = impacts[i]
        known = [x for x in impacts if x is not None]
        mean_impact = (sum(known) / len(known)) or 1.0
        shares = [
            self.chunk_ratio(float(measured[i]), seg, recompute_ratio, mean_impact) if i in online else 0.0
            for i, seg in enumerate(plan.chunks)
        ]
        if plan.relevance is not None:
            return layout.forced | self.place(plan.relevance, plan.chunks, shares, opts.selection_span_tokens)
        deviation = torch.zeros(layout.kv_end)
        deviation[step.positions] = step_deviation(step, opts.deviation_metric)
        return layout.forced | self.place(deviation, plan.chunks, shares, 1)


def full_layer_qk(step: LayerStep) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries (zero where not computed) and keys (cached where not computed) of every position at the step's layer.

    -> q [kv_end, H, D], k [kv_end, H_kv, D]
    """
    kv_end = step.layout.kv_end
    on = step.positions.to(step.q.device)
    k = step.cache.data[step.layer, 0, :kv_end].clone()
    k[on] = step.k.to(k.dtype)
    q = torch.zeros(kv_end, *step.q.shape[1:], dtype=step.q.dtype, device=step.q.device)
    q[on] = step.q
    return q, k


def chunk_focus(attention: torch.Tensor, chunks: list[Segment]) -> torch.Tensor:
    """Per chunk, its share of the question's attention to the chunks over its share of their tokens (1: even).

    Each layer's attention is normalised over the chunks' positions before the layers are added.
    attention: [L, N] (the question's attention to each position at each layer) -> [C]
    """
    inside = torch.zeros(attention.shape[1], dtype=torch.bool)
    for seg in chunks:
        inside[seg.start : seg.end] = True
    per_layer = attention / attention[:, inside].sum(dim=1, keepdim=True).clamp_min(1e-30)  # [L, N]
    total = per_layer.sum(dim=0)  # [N]
    mass = torch.stack([total[seg.start : seg.end].sum() for seg in chunks])  # [C]
    tokens = torch.tensor([float(seg.num_tokens) for seg in chunks])  # [C]
    return (mass / mass.sum().clamp_min(1e-30)) / (tokens / tokens.sum())


def chunk_share(cci: float, recompute_ratio: float, mean_impact: float, reuse_below: float, full_above: float) -> float:
    """Cache-Craft's share of a chunk to recompute: none below reuse_below, all from full_above, else r x CCI / mean."""
    if cci < reuse_below:
        return 0.0
    return 1.0 if cci >= full_above else min(1.0, recompute_ratio * cci / mean_impact)


def chunk_context_impact(
    q: torch.Tensor, k: torch.Tensor, chunks: list[Segment], num_queries: int, only: list[int] | None = None
) -> torch.Tensor:
    """Per chunk, the share of its tokens' attention that goes to the chunks before it rather than to itself.

    Only other chunks count as inter-chunk context: the prompt prefix (and the attention sink at position 0)
    counts for neither side, since a chunk's cached KV was computed after it, so the first chunk scores 0.
    `only`: the chunk indices to score (all by default; the others are NaN).
    q: [N, H, D], k: [N, H_kv, D] at one layer for all N tokens -> [C]
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    k = k.float().repeat_interleave(num_heads // k.shape[1], dim=1)  # [N, H, D]
    impacts = torch.full((len(chunks),), float("nan"))
    for index in range(len(chunks)) if only is None else only:
        seg = chunks[index]
        rows = torch.linspace(seg.start, seg.end - 1, min(num_queries, seg.num_tokens)).round().long()  # [S]
        scores = torch.einsum("shd,nhd->hsn", q[rows.to(q.device)].float(), k[: seg.end]) / math.sqrt(head_dim)
        later = torch.arange(seg.end)[None, None, :] > rows[None, :, None]  # [1, S, seg.end]
        scores = scores.masked_fill(later.to(scores.device), float("-inf"))
        probs = scores.softmax(dim=-1)  # [H, S, seg.end]
        other = torch.zeros(seg.end, dtype=torch.bool)  # the earlier chunks' positions
        for earlier in chunks[:index]:
            other[earlier.start : earlier.end] = True
        inter = probs[..., other.to(probs.device)].sum(-1)
        intra = probs[..., seg.start :].sum(-1)
        impacts[index] = float((inter / (inter + intra).clamp_min(1e-9)).mean())
    return impacts
