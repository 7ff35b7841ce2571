"""Cache-Craft (Agarwal et al., SIGMOD'25): per-chunk Cache Context Impact picks reuse, selective or full recompute."""
import math

import torch

from workers.fusion.base import FusionMode
from workers.fusion.cacheblend import step_deviation
from workers.fusion.deviation import ratio_count
from workers.fusion.layout import Segment
from workers.fusion.selective_pass import LayerStep


class CacheCraft(FusionMode):
    """At the first filter layer, chunks the context barely reaches are reused, strongly reached ones recomputed."""

    name = "cachecraft"

    def narrow(self, step: LayerStep, ratio: float) -> torch.Tensor | None:
        opts = self.options
        if step.layer != opts.filter_layers[0]:
            return None
        if len(step.positions) != step.layout.kv_end:
            raise ValueError("cachecraft needs every token recomputed up to its first filter layer")
        chunks = step.layout.chunk_segments()
        keep = step.layout.forced.clone()
        if not chunks:
            return keep.nonzero().squeeze(1)
        impact = chunk_context_impact(step.q, step.k, chunks, opts.cci_sample_queries)
        deviation = step_deviation(step, opts.deviation_metric)
        mean_impact = float(impact.mean()) or 1.0
        for seg, cci in zip(chunks, impact.tolist()):
            if cci < opts.cci_reuse_below:
                continue
            chunk_ratio = 1.0 if cci >= opts.cci_full_above else min(1.0, ratio * cci / mean_impact)
            top = torch.topk(deviation[seg.start : seg.end], ratio_count(chunk_ratio, seg.num_tokens)).indices
            keep[seg.start + top] = True
        return keep.nonzero().squeeze(1)


def chunk_context_impact(q: torch.Tensor, k: torch.Tensor, chunks: list[Segment], num_queries: int) -> torch.Tensor:
    """Per chunk, the share of its tokens' attention that goes to the chunks before it rather than to itself.

    Only other chunks count as inter-chunk context: the prompt prefix (and the attention sink at position 0)
    counts for neither side, since a chunk's cached KV was computed after it, so the first chunk scores 0.
    q: [N, H, D], k: [N, H_kv, D] fresh at one layer for all N tokens -> [C]
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    k = k.float().repeat_interleave(num_heads // k.shape[1], dim=1)  # [N, H, D]
    impacts = []
    for index, seg in enumerate(chunks):
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
        impacts.append(float((inter / (inter + intra).clamp_min(1e-9)).mean()))
    return torch.tensor(impacts)
