"""Chunk KV computed after the prompt prefix, moved to a new offset, equals computing it there (float32)."""
import torch

from workers.chunks.kv import compute_chunk_kv
from workers.model.runner import ModelRunner

SHIFT = 917  # where the chunk's context starts in the request, instead of position 0


@torch.inference_mode()
def kv_at(runner: ModelRunner, token_ids: list[int], first_position: int) -> torch.Tensor:
    """Prefill `token_ids` as if they sat at positions first_position.. (nothing before them). # [L, 2, T, H_kv, D]"""
    index = torch.arange(len(token_ids))  # slots, and the causal order of attention
    cache = runner.new_cache(len(token_ids))
    h = runner.embed(torch.tensor(token_ids))
    for layer in range(runner.config.num_layers):
        q, k, v = runner.qkv(layer, h, index + first_position)  # RoPE at the shifted positions
        cache.write(layer, index, k, v)
        h = runner.attend_and_mlp(layer, h, q, index, cache)
    return cache.data


def test_a_chunk_computed_after_the_prefix_moves_to_a_shift_like_computing_it_there(
    runner: ModelRunner, qa_records: list[dict]
) -> None:
    tokenizer = runner.checkpoint.tokenizer
    prefix = tokenizer("Passages:\n", add_special_tokens=False).input_ids
    chunk = tokenizer(qa_records[0]["documents"][0], add_special_tokens=False).input_ids
    cached = compute_chunk_kv(runner, chunk, prefix)  # K rotated for positions len(prefix)..
    there = kv_at(runner, prefix + chunk, SHIFT)[:, :, len(prefix) :]
    moved_keys = torch.stack([runner.rerotate_keys(layer, k, SHIFT) for layer, k in enumerate(cached.kv[:, 0])])
    assert not torch.allclose(cached.kv[:, 0], there[:, 0], atol=0.1)  # the shift is visible in the keys
    # Only float32 rounding differs (RoPE tables at other angles): relative error ~1e-5 over 30 layers.
    torch.testing.assert_close(moved_keys, there[:, 0], atol=2e-3, rtol=1e-4)
    torch.testing.assert_close(cached.kv[:, 1], there[:, 1], atol=2e-3, rtol=1e-4)
