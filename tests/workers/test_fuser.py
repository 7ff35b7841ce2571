"""The Fuser both engines compose: the question is visible to the modes, the KV computed is what was asked for."""
from dataclasses import replace

import pytest
import torch

from workers.chunks.store import LocalChunkStore
from workers.chunks.variants import VariantIndex
from workers.fuser import Fuser
from workers.fusion.layout import SUFFIX
from workers.model.runner import ModelRunner


@pytest.mark.parametrize("mode", ["full_reuse", "epic", "cachecraft", "cacheblend", "full_prefill"])
def test_the_question_is_visible_and_the_context_kv_is_what_fusing_the_context_alone_gives(
    runner: ModelRunner, qa_records: list[dict], mode: str
) -> None:
    # The vLLM engine fuses the whole prompt with kv_end at the context (vLLM prefills the question): its
    # injected KV must be bit for bit what fusing the context alone gave before the question was shown.
    fuser = Fuser(runner, store=LocalChunkStore())
    record = qa_records[1]
    prompt = fuser.layout(record["documents"], record["question"])
    fuser.precompute(prompt)
    context = len(prompt.token_ids) - len(prompt.suffix_ids)
    seen = fuser.fuse(prompt, mode, 0.15, kv_end=context)
    alone = fuser.fuse(replace(prompt, suffix_ids=[]), mode, 0.15)
    assert seen.layout.kv_end == context == seen.cache.capacity and seen.cache.length == context
    question = seen.layout.question
    assert (
        question is not None
        and question.kind == SUFFIX
        and (question.start, question.end) == (context, len(prompt.token_ids))
    )
    assert seen.layout.token_ids[question.start :].tolist() == prompt.suffix_ids
    assert torch.equal(seen.cache.data, alone.cache.data)
    assert seen.prefill.recomputed_fraction == alone.prefill.recomputed_fraction
    assert seen.reused_tokens_by_tier() == alone.reused_tokens_by_tier()


def test_misses_are_written_back_and_a_refused_fuser_serves_full_prefill(
    runner: ModelRunner, qa_records: list[dict]
) -> None:
    store = LocalChunkStore()
    fuser = Fuser(runner, store=store)
    record = qa_records[0]
    prompt = fuser.layout(record["documents"], record["question"])
    fused = fuser.fuse(prompt, "cacheblend", 0.15)
    assert fused.missed and fused.reused_tokens_by_tier() == {}
    fuser.write_back(fused, prompt)
    assert len(store) == 1 + len(prompt.chunk_ids)  # the prompt prefix and every chunk, never the question
    again = fuser.fuse(prompt, "cacheblend", 0.15)
    assert not again.missed and sum(again.reused_tokens_by_tier().values()) == again.layout.num_context_tokens
    refused = Fuser(runner, store=store, blending_refused="canary gate failed")
    served = refused.fuse(prompt, "cacheblend", 0.15)
    assert served.mode.name == "full_prefill" and served.reused_tokens_by_tier() == {}


def test_with_variants_every_chunk_reading_pass_is_written_back_even_with_nothing_missed(
    runner: ModelRunner, qa_records: list[dict]
) -> None:
    # The vLLM engine calls write_back only when has_write_back says so: variants are made there, after a hit.
    store = LocalChunkStore()
    plain, with_variants = Fuser(runner, store=store), Fuser(runner, store=store, variants=VariantIndex())
    record = qa_records[0]
    prompt = plain.layout(record["documents"], record["question"])
    plain.precompute(prompt)
    hit = plain.fuse(prompt, "cacheblend", 0.15)
    assert not hit.missed and not plain.has_write_back(hit)
    assert with_variants.has_write_back(with_variants.fuse(prompt, "cacheblend", 0.15))
    assert not with_variants.has_write_back(with_variants.fuse(prompt, "full_prefill", 1.0))
    missed = Fuser(runner, store=LocalChunkStore()).fuse(prompt, "cacheblend", 0.15)
    assert missed.missed and plain.has_write_back(missed)


def test_a_cache_too_small_and_an_unknown_chunk_context_are_refused(
    runner: ModelRunner, qa_records: list[dict]
) -> None:
    fuser = Fuser(runner)
    prompt = fuser.layout(qa_records[0]["documents"], qa_records[0]["question"])
    with pytest.raises(ValueError, match="cannot hold"):
        fuser.fuse(prompt, "full_prefill", 1.0, cache=runner.new_cache(len(prompt.token_ids) - 1))
    with pytest.raises(ValueError, match="chunk_context"):
        Fuser(runner, chunk_context="suffix")
