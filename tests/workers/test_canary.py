"""The canary gate: passes on the real model, refuses a deliberately broken RoPE re-rotation and falls back."""
import logging

import pytest
import torch

from workers.canary import canary_gate, measure_canary
from workers.checkpoint import Checkpoint
from workers.engine import BlendEngine, BlendRequest
from workers.sampling import SamplingParams


def test_canary_passes_with_correct_rerotation(engine: BlendEngine) -> None:
    report = canary_gate(engine)
    assert report.passed and engine.blending_refused is None
    assert report.kv_deviation < report.max_deviation / 2  # not a near miss
    assert len(engine.store) == 0  # the canary's chunks stay out of the serving store


def test_canary_refuses_unrotated_keys_and_the_engine_serves_full_prefill(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, qa_records: list[dict]
) -> None:
    engine = BlendEngine(checkpoint)
    monkeypatch.setattr(engine.runner, "rerotate_keys", lambda k, delta: k)  # positions never recovered
    with caplog.at_level(logging.ERROR, logger="workers.canary"):
        report = canary_gate(engine)
    assert not report.passed and report.kv_deviation > 2 * report.max_deviation
    assert "blending refused" in caplog.text and "canary gate" in caplog.text
    record = qa_records[0]
    short = SamplingParams(max_new_tokens=4)
    request = BlendRequest(record["documents"], record["question"], "cacheblend", 0.15, short)
    served = engine.generate(request)
    reference = engine.generate(BlendRequest(record["documents"], record["question"], "full_prefill",
                                             sampling=SamplingParams(max_new_tokens=4)))
    assert served.stats.mode == "full_prefill" and served.stats.reused_tokens == 0
    assert served.token_ids == reference.token_ids


def test_a_wrong_rotation_direction_is_also_caught(checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = BlendEngine(checkpoint)
    rerotate = engine.runner.rerotate_keys

    def backwards(k: torch.Tensor, delta: int) -> torch.Tensor:
        return rerotate(k, -delta)

    monkeypatch.setattr(engine.runner, "rerotate_keys", backwards)
    assert not measure_canary(engine).passed
