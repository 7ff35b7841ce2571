"""The canary gate: passes on the real model, refuses a deliberately broken RoPE re-rotation and falls back."""
import logging

import pytest
import torch

from workers.chunks.store import LocalChunkStore
from workers.engines.base import BlendRequest
from workers.engines.torch_engine import TorchEngine
from workers.fuser import Fuser
from workers.fusion.base import FusionOptions
from workers.generation.prompt import PromptTemplate
from workers.generation.sampling import SamplingParams
from workers.guardrails.canary import measure_canary
from workers.guardrails.guards import GuardrailsConfig, guarded_fuser
from workers.model.checkpoint import Checkpoint
from workers.model.runner import ModelRunner


def guarded(runner: ModelRunner, store: LocalChunkStore) -> Fuser:
    """The serving Fuser with the canary on, as a worker builds it."""
    template = PromptTemplate(runner.checkpoint.tokenizer)
    return guarded_fuser(runner, FusionOptions(), store, template, "prefix", GuardrailsConfig(canary=True))


def test_canary_passes_with_correct_rerotation(runner: ModelRunner) -> None:
    store = LocalChunkStore()
    fuser = guarded(runner, store)
    assert fuser.blending_refused is None
    report = measure_canary(fuser)
    assert report.passed and report.kv_deviation < report.max_deviation / 2  # not a near miss
    assert len(store) == 0  # the canary's chunks stay out of the serving store


def test_canary_refuses_unrotated_keys_and_the_engine_serves_full_prefill(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, qa_records: list[dict]
) -> None:
    runner = ModelRunner(checkpoint)
    monkeypatch.setattr(runner, "rerotate_keys", lambda layer, k, delta: k)  # positions never recovered
    with caplog.at_level(logging.ERROR, logger="workers.guardrails.canary"):
        engine = TorchEngine(guarded(runner, LocalChunkStore()))
    assert not measure_canary(engine.fuser).passed
    assert engine.fuser.blending_refused is not None and "canary gate" in engine.fuser.blending_refused
    assert "blending refused" in caplog.text and "canary gate" in caplog.text
    record = qa_records[0]
    short = SamplingParams(max_new_tokens=4)
    served = engine.generate(BlendRequest(record["documents"], record["question"], "cacheblend", 0.15, short))
    reference = engine.generate(BlendRequest(record["documents"], record["question"], "full_prefill", sampling=short))
    assert served.stats.mode == "full_prefill" and served.stats.reused_tokens == 0
    assert served.token_ids == reference.token_ids


def test_a_wrong_rotation_direction_is_also_caught(checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = ModelRunner(checkpoint)
    rerotate = runner.rerotate_keys

    def backwards(layer: int, k: torch.Tensor, delta: int) -> torch.Tensor:
        return rerotate(layer, k, -delta)

    monkeypatch.setattr(runner, "rerotate_keys", backwards)
    report = measure_canary(Fuser(runner))
    assert not report.passed and report.kv_deviation > 2 * report.max_deviation
