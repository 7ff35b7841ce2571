"""The layer-wise runner against the transformers implementation of the same real model."""
import torch
from transformers import AutoModelForCausalLM

from workers.generation.decode import iter_decode
from workers.generation.sampling import SamplingParams
from workers.model.checkpoint import Checkpoint
from workers.model.runner import ModelRunner


def test_prefill_and_decode_logits_match_transformers(checkpoint: Checkpoint, runner: ModelRunner) -> None:
    ids = checkpoint.tokenizer("The capital of France is Paris. The capital of Germany is",
                               add_special_tokens=False, return_tensors="pt").input_ids[0]
    reference = AutoModelForCausalLM.from_pretrained(str(checkpoint.path), dtype=torch.float32)
    cache = runner.new_cache(len(ids) + 1)
    logits = runner.logits(runner.forward(ids, cache, 0))
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    torch.testing.assert_close(logits, expected, atol=2e-4, rtol=1e-4)
    assert checkpoint.tokenizer.decode(logits[-1].argmax()).strip() == "Berlin"

    next_id = logits[-1].argmax()[None]
    step_logits = runner.logits(runner.forward(next_id, cache, len(ids)))[-1]
    with torch.no_grad():
        expected_step = reference(torch.cat([ids, next_id])[None]).logits[0, -1]
    torch.testing.assert_close(step_logits, expected_step, atol=2e-4, rtol=1e-4)


def test_forward_refuses_to_overflow_the_cache(runner: ModelRunner) -> None:
    cache = runner.new_cache(4)
    try:
        runner.forward(torch.arange(5), cache, 0)
    except ValueError as error:
        assert "exceeds the cache capacity" in str(error)
    else:
        raise AssertionError("overflowing the cache must raise")


def test_decode_stops_at_a_stop_token_or_max_tokens(checkpoint: Checkpoint, runner: ModelRunner) -> None:
    ids = torch.tensor(checkpoint.tokenizer("Once upon a time", add_special_tokens=False).input_ids)

    def run(params: SamplingParams) -> list[int]:
        cache = runner.new_cache(len(ids) + params.max_new_tokens)
        first_logits = runner.logits(runner.forward(ids, cache, 0))[-1]
        return list(iter_decode(runner, cache, first_logits, params))

    free = run(SamplingParams(max_new_tokens=5))
    assert len(free) == 5
    assert run(SamplingParams(max_new_tokens=5, stop_token_ids=(free[2],)))[:3] == free[:3]
    assert len(run(SamplingParams(max_new_tokens=5, stop_token_ids=(free[2],)))) == free.index(free[2]) + 1
    sampled = run(SamplingParams(max_new_tokens=5, temperature=0.8, seed=3))
    assert sampled == run(SamplingParams(max_new_tokens=5, temperature=0.8, seed=3))
