"""Token choice: greedy is argmax, top-p keeps only the nucleus, a seed makes sampling repeatable."""
import pytest
import torch

from workers.generation.sampling import SamplingParams, next_token, until_stop


def test_greedy_picks_the_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert next_token(logits, SamplingParams(), None) == 1


def test_top_p_never_leaves_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    params = SamplingParams(temperature=1.0, top_p=0.7)
    generator = torch.Generator().manual_seed(0)
    picks = {next_token(logits, params, generator) for _ in range(300)}
    assert picks == {0, 1}


def test_a_seed_repeats_the_same_samples() -> None:
    logits = torch.zeros(50)
    params = SamplingParams(temperature=1.0, seed=7)
    first = [next_token(logits, params, torch.Generator().manual_seed(7)) for _ in range(5)]
    second = [next_token(logits, params, torch.Generator().manual_seed(7)) for _ in range(5)]
    assert first == second


@pytest.mark.parametrize("kwargs", [{"max_new_tokens": 0}, {"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_invalid_sampling_parameters_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_the_answer_ends_before_the_first_stop_token() -> None:
    assert until_stop([5, 6, 2, 7, 2], (2, 9)) == [5, 6]
    assert until_stop([5, 6], (2,)) == [5, 6]
    assert until_stop([9], (2, 9)) == []
