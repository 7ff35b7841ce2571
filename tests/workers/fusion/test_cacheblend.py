"""The per-request fallback: a request whose check-layer deviation is not sparse runs at a higher ratio, or in full."""
import pytest
import torch

from workers.engines.base import BlendRequest, BlendResult
from workers.engines.torch_engine import TorchEngine
from workers.fusion.base import FallbackOptions, FusionOptions
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
    assert result.stats.recompute_ratio == 1.0
    assert result.stats.recomputed_fraction == pytest.approx(1.0)
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
