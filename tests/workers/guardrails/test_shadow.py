"""The shadow sampler: a sampled share of blended requests re-run in full prefill off the hot path, summarised."""
import pytest

from workers.engines.base import BlendRequest
from workers.engines.torch_engine import TorchEngine
from workers.generation.sampling import SamplingParams
from workers.guardrails.shadow import ShadowSampler
from workers.model.checkpoint import Checkpoint

SHORT = SamplingParams(max_new_tokens=2)


def serve(engine: TorchEngine, sampler: ShadowSampler, record: dict, mode: str) -> bool:
    request = BlendRequest(record["documents"], record["question"], mode, 0.15, SHORT)
    return sampler.observe(request, engine.open(request).stats)


def test_every_sampled_request_is_compared(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    engine = TorchEngine.from_checkpoint(checkpoint)
    sampler = ShadowSampler(engine, fraction=1.0)
    try:
        for record in qa_records[:2]:
            engine.fuser.precompute(engine.fuser.layout(record["documents"], record["question"]))
            assert serve(engine, sampler, record, "full_reuse")
        assert not serve(engine, sampler, qa_records[0], "full_prefill")  # nothing to compare against
        sampler.drain()
        summary = sampler.summary()
    finally:
        sampler.close()
    assert (summary.requests_seen, summary.sampled, summary.completed, summary.failed) == (2, 2, 2, 0)
    assert summary.first_token_kl_sum > 0  # full reuse does deviate from full prefill
    assert summary.first_token_kl_max >= summary.first_token_kl_mean > 0
    assert 0.0 <= summary.top1_agreement <= 1.0


@pytest.mark.slow  # the default run keeps make test within 15 minutes; the test above samples and compares
def test_fraction_zero_samples_nothing_and_a_full_queue_drops(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    engine = TorchEngine.from_checkpoint(checkpoint)
    never = ShadowSampler(engine, fraction=0.0)
    assert not serve(engine, never, qa_records[0], "full_reuse")
    never.close()
    assert never.summary().requests_seen == 1 and never.summary().sampled == 0

    sampler = ShadowSampler(engine, fraction=1.0, max_pending=1)
    for _ in range(4):
        serve(engine, sampler, qa_records[0], "full_reuse")
    sampler.close()
    summary = sampler.summary()
    assert summary.sampled == 4 and summary.completed + summary.dropped == 4


def test_fraction_is_validated(checkpoint: Checkpoint) -> None:
    with pytest.raises(ValueError):
        ShadowSampler(TorchEngine.from_checkpoint(checkpoint), fraction=1.5)
