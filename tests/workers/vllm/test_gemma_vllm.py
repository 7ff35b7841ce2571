"""Gemma 3 270M through the vLLM engine (float32): the connector under vLLM's hybrid KV cache manager.

vLLM keeps Gemma 3's sliding-window layers in their own KV cache groups whose blocks before the window are its
null block; the connector writes each layer's context KV into its own group's real blocks. Blended at r = 1.0
it must answer like plain vLLM on contexts long enough that those groups skip whole blocks.
"""
import importlib.util
from collections.abc import Iterator

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed in this environment", allow_module_level=True)

# Slow: starting a Gemma vLLM engine costs ~35-50 s on an AVX2-only CPU, which the 15-minute make test cannot
# carry; Gemma's invariants run by default in the torch engine (tests/workers/model/test_gemma.py). `make test-all`.
pytestmark = pytest.mark.slow

from tests.workers.vllm.conftest import DATA_FILE, DTYPE, KV_CACHE_BYTES, LOGPROB_ATOL  # noqa: E402
from tests.workers.vllm.test_vllm_engine import ROTATION_ATOL, ROTATION_RTOL, _answer, _records  # noqa: E402
from workers.model.checkpoint import load_checkpoint  # noqa: E402
from workers.model.gemma import prepare_gemma3  # noqa: E402
from workers.model.runner import ModelRunner  # noqa: E402
from workers.vllm import handoff  # noqa: E402

LOCAL_LAYER, GLOBAL_LAYER = 0, 5
BLOCK = 128  # vLLM's CPU block size


@pytest.fixture(scope="module")
def gemma_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A VLLMEngine on Gemma 3 270M; it may share the process with the default model's engines."""
    from workers.vllm.engine import VLLMEngine
    from workers.vllm.settings import VLLMSettings

    settings = VLLMSettings(max_model_len=4096, kv_cache_bytes=KV_CACHE_BYTES)
    engine = VLLMEngine.start(prepare_gemma3(), tmp_path_factory.mktemp("vllm-gemma"), settings, DTYPE)
    try:
        yield engine
    finally:
        engine.close()


def test_vllm_keeps_sliding_window_layers_in_their_own_groups(gemma_engine) -> None:
    config = gemma_engine.call(lambda: gemma_engine._loop.engine.vllm_config)
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is False  # the connector supports HMA
    kv_config = gemma_engine.call(lambda: gemma_engine._loop.engine.engine_core.engine_core.scheduler.kv_cache_config)
    windows = {type(g.kv_cache_spec).__name__ for g in kv_config.kv_cache_groups}
    assert windows == {"FullAttentionSpec", "SlidingWindowSpec"}


def test_vllm_modules_rotate_like_blendserve_per_layer(gemma_engine) -> None:
    """Fresh Q/K/V (QK-norm, each layer's RoPE base) and moved cached keys equal blendserve's float32 runner."""
    ours = gemma_engine.fuser.runner
    reference = ModelRunner(load_checkpoint(prepare_gemma3(), torch.float32))
    torch.manual_seed(0)
    h = torch.randn(40, ours.config.hidden_size)
    base = torch.arange(900, 940)
    for layer in (LOCAL_LAYER, GLOBAL_LAYER):
        for fresh, expected in zip(ours.qkv(layer, h, base), reference.qkv(layer, h, base)):
            torch.testing.assert_close(fresh, expected, atol=ROTATION_ATOL, rtol=ROTATION_RTOL)
        _, keys, _ = ours.qkv(layer, h, base)
        for delta in (1, 777, -900):
            _, expected, _ = reference.qkv(layer, h, base + delta)
            moved = ours.rerotate_keys(layer, keys, delta)
            torch.testing.assert_close(moved, expected, atol=ROTATION_ATOL, rtol=ROTATION_RTOL)


def test_cacheblend_at_full_ratio_answers_like_plain_vllm_past_the_window(gemma_engine) -> None:
    """Contexts of ~1k tokens: each sliding-window group holds null blocks before the window."""
    for docs, question in _records(DATA_FILE, 3, 8):
        prompt = gemma_engine.fuser.layout(docs, question)
        context = len(prompt.token_ids) - len(prompt.suffix_ids)
        assert context - 511 >= 2 * BLOCK  # vLLM skips whole blocks of the sliding-window groups
        gemma_engine.store_documents(docs, "gemma")
        plain, plain_stats = _answer(gemma_engine, docs, question, "full_prefill", namespace="gemma")
        blended, stats = _answer(gemma_engine, docs, question, "cacheblend", 1.0, namespace="gemma")
        assert stats.reused_tokens > 0
        a, b = plain_stats.first_token_logprobs, stats.first_token_logprobs
        top = int(a.argmax())
        assert top == int(b.argmax()) and abs(float(a[top] - b[top])) < LOGPROB_ATOL
        assert blended == plain
    assert handoff.num_held() == 0


def test_blended_default_ratio_answers(gemma_engine) -> None:
    docs, question = _records(DATA_FILE, 1, 8)[0]
    gemma_engine.store_documents(docs, "gemma-default")
    tokens, stats = _answer(gemma_engine, docs, question, namespace="gemma-default")
    assert tokens and stats.reused_tokens > 0.9 * stats.context_tokens
