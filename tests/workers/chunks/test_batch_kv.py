"""Several chunks in one packed pass give each chunk the KV a pass of its own gives (the real model, tiny Gemma 3)."""
from pathlib import Path

import pytest
import torch

from tests.workers.model.tiny_checkpoints import tiny_checkpoint
from workers.chunks.batch_kv import compute_chunks_kv, token_batches
from workers.chunks.kv import compute_chunk_kv
from workers.model.checkpoint import load_checkpoint
from workers.model.runner import ModelRunner


def test_parts_are_grouped_in_order_within_the_token_budget() -> None:
    assert token_batches([3, 4, 2, 9, 1], context_tokens=2, max_batch_tokens=10) == [[0, 1], [2], [3], [4]]
    assert token_batches([20], context_tokens=5, max_batch_tokens=10) == [[0]]  # too long to share: alone
    assert token_batches([], context_tokens=5, max_batch_tokens=10) == []
    with pytest.raises(ValueError, match="max_batch_tokens"):
        token_batches([1], 0, 0)


def _passages(runner: ModelRunner, qa_records: list[dict]) -> list[list[int]]:
    tokenizer = runner.checkpoint.tokenizer
    texts = list(qa_records[0]["documents"][:3])
    return [tokenizer(text, add_special_tokens=False).input_ids for text in texts]


def test_packed_chunks_equal_one_pass_each_in_float32(runner: ModelRunner, qa_records: list[dict]) -> None:
    tokenizer = runner.checkpoint.tokenizer
    prefix = tokenizer("Passages:\n", add_special_tokens=False).input_ids
    parts = _passages(runner, qa_records)
    packed = compute_chunks_kv(runner, parts, prefix, max_batch_tokens=sum(map(len, parts)) // 2)
    assert [c.token_ids for c in packed] == parts
    for chunk, ids in zip(packed, parts):
        alone = compute_chunk_kv(runner, ids, prefix)
        assert chunk.base_position == alone.base_position == len(prefix)
        # float32 rounding only (other matmul shapes): the same bound test_kv.py holds moved chunks to.
        torch.testing.assert_close(chunk.kv, alone.kv, atol=2e-3, rtol=1e-4)


@pytest.mark.slow  # bf16 is emulated on AVX2-only CPUs (~100x slower); float32 above runs by default
def test_packed_chunks_in_bfloat16_are_as_close_to_exact_as_one_pass_each(
    runner: ModelRunner, qa_records: list[dict]
) -> None:
    from workers.model.default import prepare_default_model

    bf16 = ModelRunner(load_checkpoint(prepare_default_model(), torch.bfloat16))
    parts = _passages(runner, qa_records)[:2]
    packed = compute_chunks_kv(bf16, parts, [1, 2, 3])
    for chunk, ids in zip(packed, parts):
        exact = compute_chunk_kv(runner, ids, [1, 2, 3]).kv  # float32, the reference both bf16 passes round from
        alone = compute_chunk_kv(bf16, ids, [1, 2, 3]).kv.float()
        # bf16 rounding compounds over 30 layers and differs with each matmul's shape, so the packed pass is
        # held to the error a pass of its own makes (measured ~1-2% of the KV's norm), not to the other's bits.
        alone_error = (alone - exact).norm() / exact.norm()
        packed_error = (chunk.kv.float() - exact).norm() / exact.norm()
        assert packed_error <= 1.25 * alone_error


def test_windowed_copies_hide_the_context_at_window_layers(tmp_path: Path) -> None:
    _, path = tiny_checkpoint("gemma3", tmp_path / "gemma3")
    runner = ModelRunner(load_checkpoint(path, torch.float32))
    context, parts = [2, 40, 41, 42], [list(range(100, 113)), list(range(200, 205)), list(range(300, 311))]
    for hide in (False, True):
        packed = compute_chunks_kv(runner, parts, context, hide_context_at_windows=hide)
        for chunk, ids in zip(packed, parts):
            alone = compute_chunk_kv(runner, ids, context, hide_context_at_windows=hide)
            torch.testing.assert_close(chunk.kv, alone.kv, atol=1e-5, rtol=1e-5)
    hidden = compute_chunks_kv(runner, parts, context, hide_context_at_windows=True)[0].kv
    seen = compute_chunks_kv(runner, parts, context)[0].kv
    assert not torch.allclose(hidden, seen)  # the windowed copy differs: its window layers never saw the context
