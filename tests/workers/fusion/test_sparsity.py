"""The check-layer sparsity test: concentrated deviation keeps the ratio, spread deviation raises it or goes full."""
import pytest
import torch

from workers.fusion.sparsity import coverage, escalated_ratio, tokens_for_coverage


def test_coverage_and_tokens_for_coverage() -> None:
    deviation = torch.tensor([8.0, 1.0, 0.5, 0.5])
    assert coverage(deviation, 1) == pytest.approx(0.8)
    assert coverage(deviation, 0) == 0.0 and coverage(deviation, 4) == 1.0
    assert coverage(torch.zeros(5), 2) == 1.0  # nothing deviates: any set covers it
    assert tokens_for_coverage(deviation, 0.8) == 1
    assert tokens_for_coverage(deviation, 0.85) == 2
    assert tokens_for_coverage(deviation, 1.0) == 4


def test_concentrated_deviation_keeps_the_ratio() -> None:
    deviation = torch.cat([torch.full((10,), 100.0), torch.full((90,), 0.1)])  # 10% of tokens hold 99%
    assert escalated_ratio(deviation, 0.15, 2.0, 0.6, 0.5) == 0.15


def test_spread_deviation_raises_the_ratio_then_goes_full() -> None:
    deviation = torch.cat([torch.full((50,), 2.0), torch.full((50,), 1.0)])
    # Kept at the check layer: 2 x 0.15 = 30 tokens hold 60/150 = 40%. 60% needs 45 tokens: ratio 0.225.
    assert escalated_ratio(deviation, 0.15, 2.0, 0.6, 0.5) == pytest.approx(0.225)
    uniform = torch.ones(100)  # 90% coverage needs 90 tokens: ratio 0.45 > 0.4 -> full recompute
    assert escalated_ratio(uniform, 0.15, 2.0, 0.9, 0.4) == 1.0
    assert escalated_ratio(uniform, 0.15, 2.0, 0.0, 0.4) == 0.15  # the check is off
