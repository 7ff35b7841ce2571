"""Teacher-forced divergence along the reference answer (pure functions)."""
import math

import pytest
import torch

from workers.generation.divergence import first_token_kl, teacher_forced_divergence


def test_identical_distributions_do_not_diverge() -> None:
    logprobs = torch.randn(5, 11).log_softmax(-1)
    result = teacher_forced_divergence(logprobs, logprobs.clone(), torch.randint(0, 11, (5,)))
    assert result.kl == 0.0 and result.nll_gap == 0.0 and result.first_token_kl == 0.0


def test_kl_and_nll_gap_by_hand() -> None:
    reference = torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log()
    other = torch.tensor([[0.25, 0.75], [0.9, 0.1]]).log()
    result = teacher_forced_divergence(reference, other, torch.tensor([0, 0]))
    first = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert result.first_token_kl == pytest.approx(first)
    assert result.first_token_kl == pytest.approx(first_token_kl(reference[0], other[0]))
    assert result.kl == pytest.approx(first / 2)  # the second position agrees
    assert result.nll_gap == pytest.approx(math.log(0.5 / 0.25) / 2)  # -log 0.25 + log 0.5 at the first


def test_shapes_must_match() -> None:
    with pytest.raises(ValueError):
        teacher_forced_divergence(torch.zeros(3, 4), torch.zeros(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError):
        teacher_forced_divergence(torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))
