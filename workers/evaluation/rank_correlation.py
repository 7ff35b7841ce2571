"""Spearman rank correlation with tied values sharing their average rank (pure functions)."""
import torch


def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """0-based ranks, tied values given the mean of the ranks they span. # [N] -> [N] float64"""
    values = values.double()
    order = torch.argsort(values, stable=True)
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(values.numel(), dtype=torch.float64)
    unique, inverse = torch.unique(values, return_inverse=True)
    sums = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, ranks)
    counts = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(ranks))
    return (sums / counts)[inverse]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of the two vectors' average ranks; 0.0 when either is constant. # [N], [N]"""
    ra, rb = (r - r.mean() for r in (average_ranks(a), average_ranks(b)))
    norm = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / norm if norm > 0.0 else 0.0
