"""Greedy decoding over the runner's cache equals recomputing the whole sequence for every token (float32)."""
import torch

from workers.generation.decode import greedy_answer
from workers.model.runner import ModelRunner


@torch.inference_mode()
def test_greedy_answer_is_each_step_of_a_full_recompute(runner: ModelRunner) -> None:
    ids = runner.checkpoint.tokenizer("The capital of France is", add_special_tokens=False).input_ids
    answer, cache = greedy_answer(runner, ids, 6)
    assert len(answer) == 6 and cache.length == len(ids) + 5  # the last token is never fed back
    sequence = list(ids)
    for token in answer:
        hidden = runner.forward(torch.tensor(sequence), runner.new_cache(len(sequence)), 0)
        assert int(runner.logits(hidden[-1:]).argmax(-1)) == token
        sequence.append(token)
