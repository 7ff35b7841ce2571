"""The per-request fallback: a request whose check-layer deviation is not sparse runs at a higher ratio, or in full."""
import pytest
import torch

from workers.engines.base import BlendRequest, BlendResult
from workers.engines.torch_engine import TorchEngine
from workers.fusion.base import FallbackOptions, FusionOptions, all_positions
from workers.fusion.cacheblend import CacheBlend
from workers.fusion.deviation import ratio_count
from workers.fusion.layout import BlendLayout
from workers.generation.conversation import Conversation
from workers.generation.sampling import SamplingParams
from workers.model.checkpoint import Checkpoint

SHORT = SamplingParams(max_new_tokens=4)


def answer(engine: TorchEngine, record: dict, mode: str = "cacheblend", ratio: float | None = 0.15) -> BlendResult:
    engine.fuser.precompute(engine.fuser.layout(record["documents"], record["question"]))
    return engine.generate(BlendRequest(record["documents"], record["question"], mode, ratio, SHORT))


@pytest.mark.slow  # the default run keeps make test within 15 minutes
def test_sparse_requests_keep_their_ratio(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    engine = TorchEngine.from_checkpoint(
        checkpoint, FusionOptions(fallback=FallbackOptions(min_coverage=0.5))
    )  # real requests cover ~0.7
    assert answer(engine, qa_records[0]).stats.recompute_ratio == 0.15


@pytest.mark.slow  # the default run keeps make test within 15 minutes
def test_a_demanding_coverage_raises_the_ratio(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    options = FusionOptions(fallback=FallbackOptions(min_coverage=0.95, full_above=1.0))
    engine = TorchEngine.from_checkpoint(checkpoint, options)
    result = answer(engine, qa_records[0])
    assert 0.15 < result.stats.recompute_ratio < 1.0
    assert (
        result.stats.recomputed_fraction
        > answer(TorchEngine.from_checkpoint(checkpoint), qa_records[0]).stats.recomputed_fraction
    )


def test_not_sparse_at_all_recomputes_in_full(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    options = FusionOptions(fallback=FallbackOptions(min_coverage=0.99, full_above=0.2))
    engine = TorchEngine.from_checkpoint(checkpoint, options)
    result = answer(engine, qa_records[1])
    reference = answer(engine, qa_records[1], "full_prefill", None)
    prompt = engine.fuser.layout(qa_records[1]["documents"], qa_records[1]["question"])
    exact = len(prompt.prefix_ids) + len(prompt.chunk_ids[0])  # chunk KV follows this prefix: the first is exact
    assert result.stats.recompute_ratio == 1.0
    num_context = len(prompt.token_ids) - len(prompt.suffix_ids)
    assert result.stats.recomputed_fraction == pytest.approx(1.0 - exact / num_context)
    assert result.token_ids == reference.token_ids
    torch.testing.assert_close(
        result.stats.first_token_logprobs, reference.stats.first_token_logprobs, atol=2e-3, rtol=0.0
    )


def test_the_check_layers_coverage_is_reported_and_grows_with_the_ratio(
    checkpoint: Checkpoint, qa_records: list[dict]
) -> None:
    engine = TorchEngine.from_checkpoint(checkpoint)  # fallback off: the coverage is still measured
    record = qa_records[1]
    prompt = engine.fuser.layout(record["documents"], record["question"])
    engine.fuser.precompute(prompt)
    coverage = {ratio: engine.fuser.fuse(prompt, "cacheblend", ratio).prefill.check_coverage for ratio in (0.15, 0.3)}
    # layers 0-1 compute every token whatever the ratio, so one deviation is ranked: more kept, more of it held
    assert 0.15 < coverage[0.15] < coverage[0.3] <= 1.0, coverage
    assert engine.fuser.fuse(prompt, "full_reuse", 0.0).prefill.check_coverage is None


class EveryToken(CacheBlend):
    """CacheBlend recomputing the exact leading run at layer 0 and the check layer too."""

    def initial(self, layout: BlendLayout, recompute_ratio: float) -> torch.Tensor:
        return all_positions(layout)


def test_skipping_the_exact_run_saves_its_work_and_changes_nothing_else(
    checkpoint: Checkpoint, qa_records: list[dict]
) -> None:
    options = FusionOptions(selection_span_tokens=1)  # token by token: one span cannot hold exact and other tokens
    engine = TorchEngine.from_checkpoint(checkpoint, options)
    engine.fuser.modes["every_token"] = EveryToken(options)
    record = qa_records[1]
    prompt = engine.fuser.layout(record["documents"], record["question"])
    engine.fuser.precompute(prompt)
    skipped, every = (engine.fuser.fuse(prompt, mode, 0.15) for mode in ("cacheblend", "every_token"))
    exact = skipped.layout.exact_end()
    assert exact == len(prompt.prefix_ids) + len(prompt.chunk_ids[0])
    assert every.prefill.recomputed_token_layers - skipped.prefill.recomputed_token_layers == 2 * exact
    assert skipped.prefill.check_coverage == pytest.approx(every.prefill.check_coverage, abs=1e-6)
    torch.testing.assert_close(skipped.cache.data, every.cache.data, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(skipped.prefill.last_hidden, every.prefill.last_hidden, atol=1e-4, rtol=1e-4)


def test_a_conversations_stored_prefix_takes_no_share_of_the_budget(
    checkpoint: Checkpoint, qa_records: list[dict]
) -> None:
    options = FusionOptions(selection_span_tokens=1)  # token by token, so the kept count is the budget exactly
    engine = TorchEngine.from_checkpoint(checkpoint, options)
    documents, question = qa_records[0]["documents"], qa_records[0]["question"]
    conversation = Conversation("You answer in a few words.").then("Who wrote it?", "A novelist, in 1901.")
    prompt = engine.fuser.layout(documents, question, conversation)
    engine.fuser.precompute(prompt)  # the prefix (system prompt and the earlier turn) is stored too
    fused = engine.fuser.fuse(prompt, "cacheblend", 0.15)
    num_chunk_tokens = sum(len(ids) for ids in prompt.chunk_ids)
    num_context = num_chunk_tokens + len(prompt.prefix_ids)
    assert fused.layout.exact_end() == len(prompt.prefix_ids)  # chunk KV follows the default prefix, not this one
    # the chunks at layer 0 and the check layer, then their budget at every later layer; the prefix never
    kept = ratio_count(0.15, num_chunk_tokens)
    num_layers = engine.fuser.runner.config.num_layers
    assert fused.prefill.recomputed_token_layers == 2 * num_chunk_tokens + (num_layers - 2) * kept
    assert fused.prefill.num_context_tokens == num_context
