"""The oracle selection: the true top-deviation tokens, and full prefill at ratio 1."""
import pytest
import torch

from workers.chunks.kv import compute_chunk_kv
from workers.fusion.base import FusionOptions
from workers.fusion.layout import BlendLayout
from workers.fusion.oracle import ORACLE_WEIGHTINGS, OracleSelection, kv_error, oracle_positions, per_layer_normalised
from workers.generation.prompt import PromptLayout
from workers.model.checkpoint import Checkpoint
from workers.model.runner import ModelRunner


def test_oracle_positions_are_the_forced_and_the_largest_errors() -> None:
    error = torch.tensor([5.0, 0.1, 9.0, 0.2, 7.0, 0.3, 0.0, 0.0])
    forced = torch.tensor([False] * 6 + [True, True])
    assert oracle_positions(error, forced, 0.5, 1).tolist() == [0, 2, 4, 6, 7]  # 3 of 6 free
    assert oracle_positions(error, forced, 0.3, 2).tolist() == [2, 3, 6, 7]  # 2 of 6 free: the best span, [2, 3]
    assert oracle_positions(error, forced, 0.5, 2).tolist() == [2, 3, 4, 5, 6, 7]  # then [4, 5]
    assert oracle_positions(error, forced, 0.0, 1).tolist() == [6, 7]


def test_kv_error_sums_everything_but_the_token() -> None:
    reference = torch.zeros(2, 2, 3, 1, 2)
    cached = reference.clone()
    cached[1, 0, 2, 0, 1] = 3.0
    cached[0, 1, 0, 0, 0] = 1.0
    assert kv_error(reference, cached).tolist() == [1.0, 0.0, 9.0]


def test_oracle_at_full_ratio_is_full_prefill(checkpoint: Checkpoint, runner: ModelRunner) -> None:
    encode = lambda text: list(checkpoint.tokenizer(text, add_special_tokens=False).input_ids)  # noqa: E731
    chunks = [encode("Ada Lovelace wrote the first program. "), encode("Charles Babbage designed the engine. ")]
    prompt = PromptLayout([], chunks, encode("Who wrote the first program?"))
    layout = BlendLayout.build(prompt, [compute_chunk_kv(runner, ids) for ids in chunks], None)
    cache = runner.new_cache(layout.num_tokens)
    result = OracleSelection(FusionOptions(selection_span_tokens=1)).prefill(runner, layout, cache, 1.0)
    reference = runner.forward(layout.token_ids, runner.new_cache(layout.num_tokens), 0)
    torch.testing.assert_close(result.last_hidden, reference[-1], atol=1e-4, rtol=1e-4)
    assert result.recomputed_fraction == 1.0


def test_per_layer_normalisation_counts_every_layer_alike() -> None:
    error = torch.tensor([[100.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # [L, N]: a loud layer and a quiet one
    assert error.sum(dim=0).tolist() == [100.0, 1.0, 0.0]  # raw: the loud layer's token outweighs 100x
    assert per_layer_normalised(error).tolist() == [3.0, 3.0, 0.0]  # normalised: each layer's top counts alike


@pytest.mark.slow  # make test's budget; the oracle's selection tests stay in the default run
def test_oracle_variants_at_full_ratio_are_full_prefill(checkpoint: Checkpoint, runner: ModelRunner) -> None:
    encode = lambda text: list(checkpoint.tokenizer(text, add_special_tokens=False).input_ids)  # noqa: E731
    chunks = [encode("Ada Lovelace wrote the first program. "), encode("Charles Babbage designed the engine. ")]
    prompt = PromptLayout([], chunks, encode("Who wrote the first program?"))
    reference = runner.forward(torch.tensor(prompt.token_ids), runner.new_cache(len(prompt.token_ids)), 0)
    for weighting in ORACLE_WEIGHTINGS:
        layout = BlendLayout.build(prompt, [compute_chunk_kv(runner, ids) for ids in chunks], None)
        mode = OracleSelection(FusionOptions(selection_span_tokens=1), weighting, rounds=2)
        result = mode.prefill(runner, layout, runner.new_cache(layout.num_tokens), 1.0)
        torch.testing.assert_close(result.last_hidden, reference[-1], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        OracleSelection(FusionOptions(), "loudest")
