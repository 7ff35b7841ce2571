"""The window study's chunk KV on Gemma 3 (float32): `prefix` is the store's, `placed` hides what the window would."""
import pytest
import torch

from bench.window_sink_study import chunk_kv
from workers.chunks.kv import compute_chunk_kv
from workers.model.checkpoint import load_checkpoint
from workers.model.gemma import prepare_gemma3
from workers.model.runner import ModelRunner


@pytest.mark.slow  # loads Gemma 3 a second time; the default run keeps make test within 15 minutes
def test_a_chunk_placed_past_the_window_stops_seeing_the_prefix_at_local_layers() -> None:
    checkpoint = load_checkpoint(prepare_gemma3(), torch.float32)
    runner = ModelRunner(checkpoint)
    tokenizer = checkpoint.tokenizer
    prompt = tokenizer("Answer from the passages.", add_special_tokens=False).input_ids
    context = [checkpoint.config.bos_token_id] + prompt
    chunk = tokenizer("Paris is the capital and largest city of France.", add_special_tokens=False).input_ids
    prefix = chunk_kv(runner, context, chunk, "prefix", place=len(context))  # [L, 2, n, H_kv, D]
    torch.testing.assert_close(prefix, compute_chunk_kv(runner, chunk, context).kv)  # the store's chunk KV
    assert torch.equal(chunk_kv(runner, context, chunk, "placed", place=len(context)), prefix)  # where computed
    deep = chunk_kv(runner, context, chunk, "placed", place=2000)  # past the 512-token window of the prefix
    assert torch.equal(deep[0], prefix[0])  # layer 0's K/V come before any attention
    windowed = compute_chunk_kv(runner, chunk, context, hide_context_at_windows=True).kv  # the store's other copy
    torch.testing.assert_close(deep, windowed)
    assert not torch.allclose(deep[1], prefix[1], atol=1e-3)  # layer 0 is local: without the prefix it changed
    bos_only = chunk_kv(runner, context, chunk, "placed_bos", place=2000)
    assert not torch.allclose(bos_only[1], deep[1], atol=1e-3)  # the rest of the prefix still seen
