"""Fusion invariants on the real model (float32): exact cases equal full prefill; approximations rank as expected."""
import pytest
import torch

from workers.engines.base import BlendRequest, BlendResult
from workers.engines.torch_engine import TorchEngine
from workers.generation.divergence import first_token_kl
from workers.generation.prompt import PromptTemplate
from workers.generation.sampling import SamplingParams
from workers.model.checkpoint import Checkpoint

SHORT = SamplingParams(max_new_tokens=6)
LOGPROB_TOLERANCE = dict(atol=2e-3, rtol=0.0)


def ask(engine: TorchEngine, documents: list[str], question: str, mode: str, ratio: float = 0.15) -> BlendResult:
    """One short greedy answer."""
    return engine.generate(BlendRequest(documents, question, mode, ratio, SHORT))


def assert_same_answer(result: BlendResult, reference: BlendResult) -> None:
    """Same greedy tokens and the same first-token distribution (up to float32 rounding)."""
    assert result.token_ids == reference.token_ids
    torch.testing.assert_close(
        result.stats.first_token_logprobs, reference.stats.first_token_logprobs, **LOGPROB_TOLERANCE
    )


def test_cacheblend_at_full_ratio_equals_full_prefill(engine: TorchEngine, qa_records: list[dict]) -> None:
    record = qa_records[0]
    engine.fuser.precompute(engine.fuser.layout(record["documents"], record["question"]))
    reference = ask(engine, record["documents"], record["question"], "full_prefill")
    blended = ask(engine, record["documents"], record["question"], "cacheblend", 1.0)
    assert_same_answer(blended, reference)
    prompt = engine.fuser.layout(record["documents"], record["question"])
    exact = len(prompt.prefix_ids) + len(prompt.chunk_ids[0])  # chunk KV follows this prefix: the first is exact
    num_context = len(prompt.token_ids) - len(prompt.suffix_ids)
    assert blended.stats.recomputed_fraction == pytest.approx(1.0 - exact / num_context)


@pytest.mark.parametrize(
    "mode,ratio",
    [
        ("full_reuse", 0.0),
        ("cacheblend", 0.0),
        ("cacheblend", 0.15),
        ("cacheblend", 0.5),
        ("epic", 0.15),
        ("cachecraft", 0.15),
    ],
)
def test_single_chunk_at_position_zero_needs_no_fix(
    checkpoint: Checkpoint, bare_template: PromptTemplate, qa_records: list[dict], mode: str, ratio: float
) -> None:
    engine = TorchEngine.from_checkpoint(checkpoint, template=bare_template)
    documents, question = qa_records[1]["documents"][:1], qa_records[1]["question"]
    assert engine.fuser.layout(documents, question).prefix_ids == []
    engine.fuser.precompute(engine.fuser.layout(documents, question))
    reference = ask(engine, documents, question, "full_prefill")
    result = ask(engine, documents, question, mode, ratio)
    assert result.stats.reused_tokens > 0
    assert_same_answer(result, reference)


def test_prefix_cache_on_a_repeated_prompt_equals_full_prefill(engine: TorchEngine, qa_records: list[dict]) -> None:
    record = qa_records[2]
    reference = ask(engine, record["documents"], record["question"], "full_prefill")
    first = ask(engine, record["documents"], record["question"], "prefix_cache")
    second = ask(engine, record["documents"], record["question"], "prefix_cache")
    assert first.stats.recomputed_fraction > 0.9
    assert second.stats.recomputed_fraction < 0.05
    assert_same_answer(second, reference)


@pytest.mark.slow  # the default run keeps make test within 15 minutes
def test_cacheblend_deviates_less_than_full_reuse(engine: TorchEngine, qa_records: list[dict]) -> None:
    kl = {"full_reuse": 0.0, "cacheblend": 0.0}
    kv_error = {"full_reuse": 0.0, "cacheblend": 0.0}
    for record in qa_records:
        prompt = engine.fuser.layout(record["documents"], record["question"])
        engine.fuser.precompute(prompt)
        full = engine.fuser.fuse(prompt, "full_prefill", 1.0)
        full_logprobs = engine.fuser.runner.logits(full.prefill.last_hidden[None])[0].log_softmax(-1)
        for mode in kl:
            fused = engine.fuser.fuse(prompt, mode, 0.15)
            logprobs = engine.fuser.runner.logits(fused.prefill.last_hidden[None])[0].log_softmax(-1)
            kl[mode] += first_token_kl(full_logprobs, logprobs)
            context = slice(0, fused.layout.num_context_tokens)
            kv_error[mode] += float((fused.cache.data[:, :, context] - full.cache.data[:, :, context]).pow(2).mean())
    assert kl["cacheblend"] < kl["full_reuse"]
    assert kv_error["cacheblend"] < 0.8 * kv_error["full_reuse"]


@pytest.mark.slow  # the default run keeps make test within 15 minutes
def test_mixed_hits_reorder_and_repeat(engine: TorchEngine, qa_records: list[dict]) -> None:
    documents, question = qa_records[0]["documents"], qa_records[0]["question"]
    engine.fuser.precompute(engine.fuser.layout([documents[0], documents[2]], question))  # documents[1] stays a miss
    stored_before = len(engine.fuser.store)
    prompt = engine.fuser.layout(documents, question)
    reference = ask(engine, documents, question, "full_prefill")
    first = ask(engine, documents, question, "full_reuse")
    hits = len(prompt.prefix_ids) + len(prompt.chunk_ids[0]) + len(prompt.chunk_ids[2])
    assert first.stats.reused_tokens == hits  # the prefix and the two cached chunks; the miss was computed
    assert len(engine.fuser.store) == stored_before + 1  # and written back
    for mode in ("full_reuse", "epic", "cachecraft"):
        again = ask(engine, documents, question, mode)
        assert again.stats.reused_tokens == again.stats.context_tokens  # every chunk hits now
    assert_same_answer(ask(engine, documents, question, "epic", 1.0), reference)  # epic recomputing all is exact
    assert_same_answer(ask(engine, documents, question, "cacheblend", 1.0), reference)

    reordered = documents[::-1]
    reordered_reference = ask(engine, reordered, question, "full_prefill")
    assert_same_answer(ask(engine, reordered, question, "cacheblend", 1.0), reordered_reference)
    once = ask(engine, reordered, question, "cacheblend")
    again = ask(engine, reordered, question, "cacheblend")
    assert once.token_ids == again.token_ids
    assert once.stats.reused_tokens == again.stats.reused_tokens == once.stats.context_tokens


@pytest.mark.slow  # the default run keeps make test within 15 minutes
def test_every_mode_answers_with_no_documents(engine: TorchEngine) -> None:
    reference = ask(engine, [], "What is the capital of France?", "full_prefill")
    for mode in engine.fuser.modes:
        assert_same_answer(ask(engine, [], "What is the capital of France?", mode), reference)


def test_bad_requests_are_refused(engine: TorchEngine) -> None:
    with pytest.raises(ValueError, match="unknown fusion mode"):
        ask(engine, ["a"], "b?", "magic")
    with pytest.raises(ValueError, match="recompute_ratio"):
        ask(engine, ["a"], "b?", "cacheblend", 1.5)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        ask(engine, ["word " * 9000], "b?", "full_prefill")
