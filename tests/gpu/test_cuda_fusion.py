"""Fusion and the vLLM engine end to end on a CUDA GPU (skipped on CPU machines; bench/gpu_check.sh runs them)."""
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from workers.engines.base import BlendRequest
from workers.engines.torch_engine import TorchEngine
from workers.generation.sampling import SamplingParams
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DATA_FILE = Path(__file__).resolve().parents[3] / "shared" / "data" / "hotpotqa_hipporag.dev.jsonl"
SHORT = SamplingParams(max_new_tokens=8)


def _records(count: int) -> list[tuple[list[str], str]]:
    with open(DATA_FILE) as handle:
        rows = [json.loads(line) for _, line in zip(range(count), handle)]
    return [([c["text"] for c in row["ctxs"][:4]], row["question"]) for row in rows]


def test_torch_engine_fuses_on_the_gpu_and_full_ratio_equals_full_prefill() -> None:
    checkpoint = load_checkpoint(prepare_default_model(), torch.float32, "cuda")
    engine = TorchEngine.from_checkpoint(checkpoint)
    for docs, question in _records(2):
        engine.fuser.precompute(engine.fuser.layout(docs, question))
        reference = engine.generate(BlendRequest(docs, question, "full_prefill", sampling=SHORT))
        blended = engine.generate(BlendRequest(docs, question, "cacheblend", 1.0, SHORT))
        assert blended.stats.reused_tokens > 0 and blended.token_ids == reference.token_ids
        torch.testing.assert_close(blended.stats.first_token_logprobs, reference.stats.first_token_logprobs,
                                   atol=2e-3, rtol=0.0)
        fused = engine.fuser.fuse(engine.fuser.layout(docs, question), "cacheblend", 0.15)
        assert fused.cache.data.is_cuda and fused.prefill.last_hidden.is_cuda
        assert 0.0 < fused.prefill.recomputed_fraction < 0.5


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The vLLM engine on the GPU, in float32 (the equivalence below is held to float32 rounding)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    from workers.vllm.engine import VLLMEngine
    from workers.vllm.settings import VLLMSettings

    settings = VLLMSettings(device="cuda", gpu_memory_utilization=0.3, kv_cache_bytes=4 << 30)
    engine = VLLMEngine.start(prepare_default_model(), tmp_path_factory.mktemp("vllm-gpu"), settings, "float32")
    try:
        yield engine
    finally:
        engine.close()


def test_vllm_engine_on_the_gpu_blends_and_full_ratio_answers_like_full_prefill(vllm_engine) -> None:
    from workers.vllm import handoff

    engine = vllm_engine
    assert engine.fuser.runner.device.type == "cuda" and engine.fuser.runner.paged is None
    for docs, question in _records(4):
        engine.store_documents(docs, "gpu")
        plain = engine.open(BlendRequest(docs, question, "full_prefill", None, SHORT, "gpu"))
        plain_tokens = list(plain)
        full = engine.open(BlendRequest(docs, question, "cacheblend", 1.0, SHORT, "gpu"))
        assert full.stats.reused_tokens > 0 and list(full) == plain_tokens
        blended = engine.open(BlendRequest(docs, question, "cacheblend", 0.15, SHORT, "gpu"))
        assert len(list(blended)) > 0 and blended.stats.reused_tokens > 0
        assert blended.stats.recomputed_tokens < blended.stats.num_prompt_tokens
    assert handoff.num_held() == 0
