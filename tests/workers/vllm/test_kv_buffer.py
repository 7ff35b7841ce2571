"""ReusedKVBuffer: a fusion reuses the previous request's memory only once nobody can still read it."""
import pytest
import torch

from workers.model.config import ModelConfig, RopeConfig
from workers.model.kv_cache import KVCache
from workers.vllm.handoff import drop_kv, put_kv
from workers.vllm.kv_buffer import ReusedKVBuffer

CONFIG = ModelConfig("LlamaForCausalLM", 2, 16, 4, 2, 4, 32, 100, 1e-5, 512, RopeConfig(theta=10000.0))


def _same_memory(a: KVCache, b: KVCache) -> bool:
    return a.data.data_ptr() == b.data.data_ptr()


def test_the_buffer_is_reused_after_release_and_never_while_in_use() -> None:
    buffer = ReusedKVBuffer(CONFIG, torch.bfloat16)
    first = buffer.take(50)
    assert first.data.shape == (2, 2, 50, 2, 4)
    second = buffer.take(50)  # the first is still being filled
    assert not _same_memory(first, second)
    buffer.release(second)  # not the buffer's memory: changes nothing
    assert not _same_memory(buffer.take(50), first)
    buffer.release(first)
    assert _same_memory(buffer.take(40), first)


def test_lent_kv_blocks_reuse_until_vllm_drops_it() -> None:
    buffer = ReusedKVBuffer(CONFIG, torch.bfloat16)
    cache = buffer.take(30)
    cache.data.fill_(1.0)
    key = put_kv(cache.data[:, :, :20])
    buffer.release(cache, held_under=key)
    other = buffer.take(30)
    other.data.fill_(2.0)
    assert not _same_memory(cache, other) and bool((cache.data == 1.0).all())  # the lent KV is untouched
    drop_kv(key)
    assert _same_memory(buffer.take(30), cache)


def test_a_larger_request_grows_the_buffer_and_smaller_ones_fit_in_it() -> None:
    buffer = ReusedKVBuffer(CONFIG, torch.bfloat16)
    small = buffer.take(10)
    buffer.release(small)
    large = buffer.take(100)
    assert large.capacity == 100 and not _same_memory(small, large)
    buffer.release(large)
    again = buffer.take(60)
    assert again.capacity == 60 and _same_memory(again, large)
    assert again.data[1, 1, 59].shape == (2, 4)


def test_storage_that_cannot_hold_the_cache_is_refused() -> None:
    storage = torch.empty(2, 2, 10, 2, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cannot hold"):
        KVCache(CONFIG, 11, torch.bfloat16, storage=storage)
    with pytest.raises(ValueError, match="cannot hold"):
        KVCache(CONFIG, 5, torch.float32, storage=storage)
    assert KVCache(CONFIG, 10, torch.bfloat16, storage=storage).data.data_ptr() == storage.data_ptr()
