"""The fusion invariants on Gemma 3 270M (float32): sliding-window layers, two RoPE bases, QK-norm, embedding scale.

A small slice on purpose (the real model is ~2x SmolLM2's compute): the runner against transformers' own Gemma 3
forward across the 512-token window, r = 1.0 and a single chunk at position 0 equal to full prefill, a chunk
moved to a shift equal to computing it there on a local and a global layer, and the canary gate.
"""
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.workers.chunks.test_kv import kv_at
from tests.workers.fusion.test_invariants import ask, assert_same_answer
from workers.chunks.kv import compute_chunk_kv
from workers.chunks.sources import WINDOWED_QUALIFIER, past_the_prefix
from workers.chunks.store import DEFAULT_NAMESPACE, LocalChunkStore
from workers.engines.torch_engine import TorchEngine
from workers.fuser import Fuser
from workers.fusion.base import FusionOptions
from workers.generation.prompt import PromptTemplate
from workers.guardrails.canary import measure_canary
from workers.guardrails.guards import GuardrailsConfig, guarded_fuser
from workers.model.checkpoint import Checkpoint, load_checkpoint
from workers.model.gemma import prepare_gemma3
from workers.model.runner import ModelRunner

SHIFT = 917
LOCAL_LAYER, GLOBAL_LAYER = 0, 5  # Gemma 3 270M: layers 5, 11 and 17 are global, the rest see 512 tokens


@pytest.fixture(scope="module")
def gemma() -> Checkpoint:
    """Gemma 3 270M, prepared from its GGUF packages, loaded in float32."""
    return load_checkpoint(prepare_gemma3(), torch.float32)


@pytest.fixture(scope="module")
def gemma_runner(gemma: Checkpoint) -> ModelRunner:
    """The layer-wise runner on Gemma 3."""
    return ModelRunner(gemma)


@pytest.fixture(scope="module")
def long_prompt(gemma: Checkpoint, qa_records: list[dict]) -> list[int]:
    """900 tokens of real passages after <bos>: well past the 512-token window, so local layers drop early keys."""
    text = "\n\n".join(doc for record in qa_records for doc in record["documents"])
    ids = [gemma.config.bos_token_id] + gemma.tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) >= 900
    return ids[:900]


def test_the_model_is_gemma3_with_local_and_global_layers(gemma: Checkpoint) -> None:
    cfg = gemma.config
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.num_layers == 18
    windows = [kind.window_tokens for kind in cfg.layer_kinds]
    assert windows == ([512] * 5 + [None]) * 3
    assert cfg.layer_kind(LOCAL_LAYER).rope.theta == 10000.0 and cfg.layer_kind(GLOBAL_LAYER).rope.theta == 1e6
    assert gemma.tokenizer.chat_template is not None  # <bos> before the prompt, from the prepared tokenizer
    assert PromptTemplate(gemma.tokenizer).layout(["a"], "b?").prefix_ids[0] == cfg.bos_token_id


@torch.inference_mode()
def test_runner_matches_transformers_across_the_sliding_window(gemma: Checkpoint, long_prompt: list[int]) -> None:
    """Prefill past the window and two decode steps: logits equal transformers' Gemma 3 forward in float32."""
    reference = AutoModelForCausalLM.from_pretrained(str(gemma.path), dtype=torch.float32).eval()
    runner = ModelRunner(gemma)
    ids = torch.tensor(long_prompt)
    cache = runner.new_cache(len(ids) + 2)
    hidden = runner.forward(ids, cache, 0)
    checked = torch.tensor([0, 100, 511, 512, 600, len(ids) - 1])  # before, at and after the window's edge
    theirs = reference(ids[None], use_cache=True)
    torch.testing.assert_close(runner.logits(hidden[checked]), theirs.logits[0, checked], atol=2e-3, rtol=1e-4)
    past, next_id = theirs.past_key_values, theirs.logits[0, -1].argmax().reshape(1)
    for step in range(2):  # decode: one query at a position > 512 (the short-query path with a window)
        ours = runner.logits(runner.forward(next_id, cache, len(ids) + step))
        step_out = reference(next_id[None], past_key_values=past, use_cache=True)
        torch.testing.assert_close(ours, step_out.logits[0], atol=2e-3, rtol=1e-4)
        past, next_id = step_out.past_key_values, step_out.logits[0, -1].argmax().reshape(1)


@pytest.mark.slow  # make test's budget; the runner-against-transformers test keeps Gemma 3 in the default run
def test_cacheblend_at_full_ratio_equals_full_prefill(gemma: Checkpoint, qa_records: list[dict]) -> None:
    engine = TorchEngine.from_checkpoint(gemma)
    record = qa_records[0]
    engine.fuser.precompute(engine.fuser.layout(record["documents"], record["question"]))
    reference = ask(engine, record["documents"], record["question"], "full_prefill")
    blended = ask(engine, record["documents"], record["question"], "cacheblend", 1.0)
    assert blended.stats.reused_tokens > 0
    assert_same_answer(blended, reference)


@pytest.mark.parametrize("mode,ratio", [("full_reuse", 0.0), pytest.param("cacheblend", 0.15, marks=pytest.mark.slow)])
def test_single_chunk_at_position_zero_needs_no_fix(
    gemma: Checkpoint, qa_records: list[dict], mode: str, ratio: float
) -> None:
    bare = PromptTemplate(gemma.tokenizer, instruction="", question_template="Question: {question}\nAnswer:",
                          use_chat_template=False)
    engine = TorchEngine.from_checkpoint(gemma, template=bare)
    documents, question = qa_records[1]["documents"][:1], qa_records[1]["question"]
    assert engine.fuser.layout(documents, question).prefix_ids == []
    engine.fuser.precompute(engine.fuser.layout(documents, question))
    reference = ask(engine, documents, question, "full_prefill")
    result = ask(engine, documents, question, mode, ratio)
    assert result.stats.reused_tokens > 0
    assert_same_answer(result, reference)


@pytest.mark.parametrize("layer", [LOCAL_LAYER, GLOBAL_LAYER], ids=["local", "global"])
def test_a_chunk_computed_after_the_prefix_moves_to_a_shift_like_computing_it_there(
    gemma_runner: ModelRunner, long_prompt: list[int], layer: int
) -> None:
    """Keys re-rotated by the layer's own RoPE base; the chunk is longer than the window, so it binds here."""
    prefix, chunk = long_prompt[:40], long_prompt[40:]
    cached = compute_chunk_kv(gemma_runner, chunk, prefix)  # K rotated for positions len(prefix)..
    there = kv_at(gemma_runner, prefix + chunk, SHIFT)[layer, :, len(prefix) :]
    keys = cached.kv[layer, 0]
    assert not torch.allclose(keys, there[0], atol=0.1)  # the shift is visible in the keys
    torch.testing.assert_close(gemma_runner.rerotate_keys(layer, keys, SHIFT), there[0], atol=2e-3, rtol=1e-4)
    torch.testing.assert_close(cached.kv[layer, 1], there[1], atol=2e-3, rtol=1e-4)
    other = GLOBAL_LAYER if layer == LOCAL_LAYER else LOCAL_LAYER  # the other kind's base is visibly wrong
    assert not torch.allclose(gemma_runner.rerotate_keys(other, keys, SHIFT), there[0], atol=0.1)


def test_the_windowed_version_hides_the_prefix_from_local_layers_only(
    gemma_runner: ModelRunner, long_prompt: list[int]
) -> None:
    """Until the first global layer has seen the prefix, the chunk's KV is its own (alone, moved after the prefix)."""
    prefix, chunk = long_prompt[:40], long_prompt[40:300]
    windowed = compute_chunk_kv(gemma_runner, chunk, prefix, hide_context_at_windows=True).kv
    alone = compute_chunk_kv(gemma_runner, chunk).kv
    seen = compute_chunk_kv(gemma_runner, chunk, prefix).kv
    moved = torch.stack([gemma_runner.rerotate_keys(layer, k, len(prefix)) for layer, k in enumerate(alone[:, 0])])
    first_after_global = GLOBAL_LAYER + 1  # layer 6's input is the global layer 5's output, which saw the prefix
    torch.testing.assert_close(windowed[:first_after_global, 0], moved[:first_after_global], atol=2e-3, rtol=1e-4)
    torch.testing.assert_close(windowed[:first_after_global, 1], alone[:first_after_global, 1], atol=2e-3, rtol=1e-4)
    assert not torch.allclose(windowed[first_after_global:, 1], alone[first_after_global:, 1], atol=0.1)
    assert not torch.allclose(windowed[1:, 1], seen[1:, 1], atol=0.1)  # from layer 1 on, the prefix is hidden


def test_the_fuser_reads_the_windowed_version_where_the_window_has_left_the_prefix(
    gemma_runner: ModelRunner, qa_records: list[dict]
) -> None:
    fuser = Fuser(gemma_runner, FusionOptions())
    documents = [doc for record in qa_records[:2] for doc in record["documents"]]  # ~900 tokens
    prompt = fuser.layout(documents, qa_records[0]["question"])
    fuser.precompute(prompt)
    assert len(fuser.store) == 1 + 2 * len(prompt.chunk_ids)  # the prefix, and two versions of each chunk
    fused = fuser.fuse(prompt, "full_reuse", 0.0)
    num_prefix, start, blind = len(prompt.prefix_ids), len(prompt.prefix_ids), []
    for ids in prompt.chunk_ids:
        blind.append(past_the_prefix(start, len(ids), num_prefix, 512))
        namespace = DEFAULT_NAMESPACE + WINDOWED_QUALIFIER if blind[-1] else DEFAULT_NAMESPACE
        stored = fuser.store.get(ids, prompt.prefix_ids, namespace).kv  # [L, 2, n, H_kv, D]
        keys = torch.stack([gemma_runner.rerotate_keys(i, k, start - num_prefix) for i, k in enumerate(stored[:, 0])])
        end = start + len(ids) - 1  # the context's last token is recomputed by every mode
        torch.testing.assert_close(fused.cache.data[:, 0, start:end], keys[:, : end - start], atol=2e-3, rtol=1e-4)
        torch.testing.assert_close(fused.cache.data[:, 1, start:end], stored[:, 1, : end - start])
        start += len(ids)
    assert not blind[0] and blind[-1]  # the first chunk reads the prefix version, the deepest the windowed one


def test_canary_passes_with_correct_rerotation(gemma_runner: ModelRunner) -> None:
    report = measure_canary(Fuser(gemma_runner))  # the gate's own measurement (its refusal path: below)
    assert report.passed and report.kv_deviation < report.max_deviation / 2  # not a near miss


def test_canary_refuses_unrotated_keys(
    gemma: Checkpoint, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runner = ModelRunner(gemma)
    monkeypatch.setattr(runner, "rerotate_keys", lambda layer, k, delta: k)  # positions never recovered
    with caplog.at_level(logging.ERROR, logger="workers.guardrails.canary"):
        fuser = guarded_fuser(runner, FusionOptions(), LocalChunkStore(), PromptTemplate(gemma.tokenizer), "prefix",
                              GuardrailsConfig(canary=True))
    assert fuser.blending_refused is not None and "canary gate" in fuser.blending_refused


def test_canary_refuses_one_rope_base_for_every_layer(gemma: Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Llama-only mistake: re-rotating every layer's keys with the global layers' base."""
    runner = ModelRunner(gemma)
    rerotate = runner.rerotate_keys
    monkeypatch.setattr(runner, "rerotate_keys", lambda layer, k, delta: rerotate(GLOBAL_LAYER, k, delta))
    report = measure_canary(Fuser(runner))
    assert not report.passed and report.kv_deviation > 2 * report.max_deviation
