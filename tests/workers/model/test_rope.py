"""Position recovery: re-rotating cached keys equals computing them at the new positions."""
import torch

from workers.chunks.kv import compute_chunk_kv
from workers.model.config import RopeConfig
from workers.model.rope import apply_rope, cos_sin, inverse_frequencies, rerotate
from workers.model.runner import ModelRunner


def test_rerotate_composes_rotations_exactly() -> None:
    torch.manual_seed(0)
    inv_freq = inverse_frequencies(RopeConfig(theta=100000.0), 64)
    x = torch.randn(10, 3, 64)
    positions = torch.arange(10)
    at_zero = apply_rope(x, *cos_sin(inv_freq, positions))
    at_offset = apply_rope(x, *cos_sin(inv_freq, positions + 777))
    torch.testing.assert_close(rerotate(at_zero, inv_freq, 777), at_offset, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rerotate(at_offset, inv_freq, -777), at_zero, atol=1e-5, rtol=1e-5)


def test_real_model_chunk_keys_rerotate_to_offset(runner: ModelRunner) -> None:
    """Layer-0 keys depend only on the token and its position, so the real model checks the rotation exactly."""
    ids = torch.tensor(runner.checkpoint.tokenizer("a chunk of retrieved text", add_special_tokens=False).input_ids)
    chunk = compute_chunk_kv(runner, ids.tolist())
    offset = 1234
    _, k_at_offset, v_at_offset = runner.qkv(0, runner.embed(ids), torch.arange(len(ids)) + offset)
    assert not torch.allclose(chunk.kv[0, 0], k_at_offset, atol=0.1)  # the offset moves the keys
    torch.testing.assert_close(rerotate(chunk.kv[0, 0], runner.inv_freq, offset), k_at_offset, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        chunk.kv[0, 1], v_at_offset
    )  # values carry no position: cached ones are right as they are
