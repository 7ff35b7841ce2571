"""The recompute delay model: exact fits on synthetic timings, non-negativity, and calibration on the real runner."""
import itertools

import pytest

from workers.loading.delay_model import (
    RecomputeDelayModel,
    calibrate,
    calibrate_runner,
    fit_delay_model,
    layer_timer,
    spread_positions,
)
from workers.model.runner import ModelRunner

SHAPES = [(256, 32), (256, 256), (1024, 64), (1024, 1024), (2048, 300)]


def test_fit_recovers_the_coefficients_of_exact_timings() -> None:
    truth = RecomputeDelayModel(30, fixed_s=2e-4, per_token_s=3e-6, per_pair_s=4e-9)
    model = calibrate(truth.predict_s, SHAPES, num_layers=30)
    assert model.num_layers == 30
    for name in ("fixed_s", "per_token_s", "per_pair_s"):
        assert getattr(model, name) == pytest.approx(getattr(truth, name), rel=1e-6)
    assert model.full_prefill_s(1000) == pytest.approx(30 * truth.predict_s(1000, 1000))


def test_fit_keeps_coefficients_non_negative() -> None:
    # Time falls with the pair count here, which no physical layer does: the fit must not go negative.
    samples = [(context, selected, 0.01 + 1e-4 * selected - 1e-8 * selected * context)
               for context, selected in SHAPES]
    model = fit_delay_model(samples, num_layers=4)
    assert min(model.fixed_s, model.per_token_s, model.per_pair_s) >= 0
    assert model.predict_s(1024, 512) > model.predict_s(1024, 64) > 0
    assert model.predict_s(1024, 0) == 0.0


def test_calibrate_takes_the_median_of_repeats() -> None:
    truth = RecomputeDelayModel(2, per_token_s=1e-5)
    outliers = itertools.cycle([1.0, 0.0, 0.0])  # every third timing of a shape hits a 1 s stall

    def measure(context: int, selected: int) -> float:
        return truth.predict_s(context, selected) + next(outliers)

    model = calibrate(measure, SHAPES, num_layers=2, repeats=3)
    assert model.per_token_s == pytest.approx(1e-5, rel=1e-6) and model.fixed_s == pytest.approx(0, abs=1e-9)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: RecomputeDelayModel(0), "num_layers"),
        (lambda: RecomputeDelayModel(2, fixed_s=-1.0), ">= 0"),
        (lambda: fit_delay_model([(10, 5, 0.1), (20, 5, 0.2)], 2), "at least 3"),
        (lambda: fit_delay_model([(10, 20, 0.1)] * 3, 2), "selected <= context"),
        (lambda: calibrate(lambda c, s: 1.0, SHAPES, 2, repeats=0), "repeats"),
    ],
)
def test_invalid_inputs_are_refused(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_spread_positions_cover_the_context_and_end_at_its_last_token() -> None:
    assert spread_positions(8, 8).tolist() == list(range(8))
    positions = spread_positions(100, 7)
    assert positions[-1] == 99 and len(positions) == 7 and bool((positions.diff() > 0).all())


def test_calibration_on_the_real_runner(runner: ModelRunner) -> None:
    shapes = [(128, 16), (128, 128), (512, 64), (512, 512)]
    model = calibrate_runner(runner, shapes, repeats=1)
    assert model.num_layers == runner.config.num_layers
    assert model.predict_s(512, 512) > model.predict_s(512, 64) > 0
    measure = layer_timer(runner, 64)
    assert measure(64, 8) > 0
    with pytest.raises(ValueError, match="selected <= context"):
        measure(128, 8)
