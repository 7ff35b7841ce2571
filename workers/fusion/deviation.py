"""Per-token KV deviation and the top-k choice of tokens to recompute (pure functions)."""
import math

import torch

DEVIATION_METRICS = ("k", "v", "kv")


def kv_deviation(
    fresh_k: torch.Tensor, fresh_v: torch.Tensor, cached_k: torch.Tensor, cached_v: torch.Tensor, metric: str
) -> torch.Tensor:
    """Squared L2 distance per token between fresh and cached K, V or both. # [S, H_kv, D] x4 -> [S]"""
    if metric not in DEVIATION_METRICS:
        raise ValueError(f"unknown deviation metric {metric!r} (choose from {DEVIATION_METRICS})")
    total = torch.zeros(fresh_k.shape[0], device=fresh_k.device)
    if "k" in metric:
        total += (fresh_k.float() - cached_k.float()).pow(2).sum(dim=(1, 2))
    if "v" in metric:
        total += (fresh_v.float() - cached_v.float()).pow(2).sum(dim=(1, 2))
    return total


def keep_top(scores: torch.Tensor, forced: torch.Tensor, num_keep: int) -> torch.Tensor:
    """Ascending indices of all forced entries plus the num_keep highest-scoring others. # [S], [S] -> [K]"""
    eligible = scores.masked_fill(forced, float("-inf"))
    num_keep = max(0, min(num_keep, int((~forced).sum())))
    chosen = torch.topk(eligible, num_keep).indices if num_keep else torch.empty(0, dtype=torch.long)
    mask = forced.clone()
    mask[chosen] = True
    return mask.nonzero().squeeze(1)


def ratio_count(ratio: float, num_tokens: int) -> int:
    """Tokens to recompute for a ratio, rounded up so any positive ratio recomputes at least one."""
    return min(num_tokens, math.ceil(ratio * num_tokens - 1e-9))


def keep_top_spans(
    scores: torch.Tensor, forced: torch.Tensor, num_keep: int, positions: torch.Tensor, span_tokens: int
) -> torch.Tensor:
    """Like keep_top, but choosing whole aligned spans of positions (position // span_tokens) by summed score.

    Spans are taken best first until they hold num_keep unforced entries (the last span may overshoot).
    scores, forced, positions: [S] (positions ascending) -> [K] ascending indices
    """
    if span_tokens == 1:
        return keep_top(scores, forced, num_keep)
    _, span = torch.unique_consecutive(positions // span_tokens, return_inverse=True)  # [S] span index
    free = (~forced).float()
    num_spans = int(span[-1]) + 1
    span_score = torch.zeros(num_spans).index_add_(0, span, scores.float().nan_to_num(0.0) * free)
    span_free = torch.zeros(num_spans).index_add_(0, span, free)
    order = torch.argsort(span_score, descending=True)
    covered = torch.cumsum(span_free[order], 0)  # unforced entries held by the best 1, 2, ... spans
    num_chosen = int(torch.searchsorted(covered, float(num_keep))) + 1 if num_keep > 0 else 0
    mask = forced | torch.isin(span, order[:num_chosen])
    return mask.nonzero().squeeze(1)
