"""Is a request sparse enough for selective recompute? The deviation at the check layer decides (pure functions)."""
import torch

from workers.fusion.deviation import ratio_count


def coverage(deviation: torch.Tensor, num_keep: int) -> float:
    """Share of the total deviation held by the `num_keep` most deviating tokens (1.0 when nothing deviates). # [S]"""
    total = float(deviation.sum())
    if total <= 0.0 or num_keep >= deviation.numel():
        return 1.0
    if num_keep <= 0:
        return 0.0
    return float(torch.topk(deviation, num_keep).values.sum()) / total


def tokens_for_coverage(deviation: torch.Tensor, target: float) -> int:
    """Fewest top-deviating tokens whose deviation reaches `target` of the total. # [S]"""
    total = float(deviation.sum())
    if total <= 0.0 or target <= 0.0:
        return 0
    cumulative = torch.sort(deviation, descending=True).values.double().cumsum(0) / total
    index = torch.searchsorted(cumulative, torch.tensor([target - 1e-12], dtype=torch.float64))
    return min(deviation.numel(), int(index) + 1)


def escalated_ratio(
    deviation: torch.Tensor, ratio: float, multiplier: float, min_coverage: float, full_above: float
) -> float:
    """The ratio to use past the check layer: `ratio` if its kept set holds `min_coverage` of the deviation,
    else the smallest ratio whose kept set does, or 1.0 (full recompute) when that exceeds `full_above`.

    deviation: [S] of the reusable tokens at the check layer; the kept share there is ratio * multiplier.
    """
    num_tokens = deviation.numel()
    if min_coverage <= 0.0 or num_tokens == 0:
        return ratio
    kept = ratio_count(min(1.0, ratio * multiplier), num_tokens)
    if coverage(deviation, kept) >= min_coverage:
        return ratio
    needed = tokens_for_coverage(deviation, min_coverage) / num_tokens / multiplier
    return 1.0 if needed > full_above else max(ratio, min(1.0, needed))
