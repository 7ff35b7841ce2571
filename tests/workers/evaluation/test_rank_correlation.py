"""Spearman's rank correlation: ties share their average rank."""
import pytest
import torch

from workers.evaluation.rank_correlation import average_ranks, spearman


def test_ties_share_their_average_rank() -> None:
    assert average_ranks(torch.tensor([0.5, 1.0, 0.5, 0.0, 1.0])).tolist() == [1.5, 3.5, 1.5, 0.0, 3.5]


def test_spearman_of_monotone_reversed_and_tied_vectors() -> None:
    x = torch.tensor([0.1, 0.4, 0.2, 0.9])
    assert spearman(x, x**3) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)
    assert spearman(x, torch.ones(4)) == 0.0
    # by hand: ranks [0, 2, 1, 3] and [0.5, 2.5, 0.5, 2.5] -> centred [-1.5, .5, -.5, 1.5] . [-1, 1, -1, 1] / norms
    assert spearman(x, torch.tensor([0.0, 1.0, 0.0, 1.0])) == pytest.approx(4.0 / (5.0**0.5 * 2.0))
