"""The planner's curves and choice: fitted from timings, the faster plan taken, missed chunks priced in full."""
import numpy as np
import pytest

from workers.loading.cost_fit import fit_nonnegative
from workers.loading.request_plan import BLEND_PLAN, PLAIN_PLAN, PrefillCosts, PrefillCurve

PLAIN = PrefillCurve(fixed_s=0.05, per_token_s=2e-4, per_pair_s=1e-7)
BLEND = PrefillCurve(fixed_s=0.15, per_token_s=1e-4, per_pair_s=5e-9)
COSTS = PrefillCosts("cacheblend", 0.15, PLAIN, BLEND)


def test_curve_fit_recovers_the_curve_that_made_the_timings() -> None:
    samples = [(n, PLAIN.predict_s(n)) for n in (128, 512, 1024, 2048, 4096)]
    fitted = PrefillCurve.fit(samples)
    for n in (300, 3000, 6000):
        assert fitted.predict_s(n) == pytest.approx(PLAIN.predict_s(n), rel=1e-6)


def test_fit_keeps_coefficients_non_negative() -> None:
    # Timings that fall with size would want a negative slope: the fit pins it at zero instead.
    coefficients = fit_nonnegative(np.array([[1.0, 100.0], [1.0, 200.0], [1.0, 300.0]]), np.array([0.3, 0.2, 0.1]))
    assert (coefficients >= 0).all() and coefficients[1] == 0.0


def test_short_prompts_go_plain_and_long_ones_blend_where_the_curves_cross() -> None:
    short, long = COSTS.choose(200, 0), COSTS.choose(4000, 0)
    assert short.name == PLAIN_PLAN and short.predicted_ttft_s == pytest.approx(PLAIN.predict_s(200))
    assert short.other_ttft_s == pytest.approx(BLEND.predict_s(200)) and not short.warm_chunks
    assert long.name == BLEND_PLAN and long.predicted_ttft_s == pytest.approx(BLEND.predict_s(4000))


def test_missed_chunks_are_priced_at_plain_cost_and_warmed_when_blending_them_would_pay() -> None:
    num_tokens = 4000
    all_missed = COSTS.choose(num_tokens, num_tokens)
    assert all_missed.predicted_ttft_s == pytest.approx(PLAIN.predict_s(num_tokens))
    assert all_missed.other_ttft_s == pytest.approx(BLEND.predict_s(num_tokens) + PLAIN.predict_s(num_tokens))
    assert all_missed.name == PLAIN_PLAN and all_missed.warm_chunks  # cached, the next one blends
    assert COSTS.choose(num_tokens, 100).name == BLEND_PLAN


def test_the_costs_price_only_the_mode_and_ratio_they_were_measured_for() -> None:
    assert COSTS.prices("cacheblend", 0.15)
    assert not COSTS.prices("cacheblend", 0.3) and not COSTS.prices("query_driven", 0.15)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: PrefillCurve(-1.0, 0.0, 0.0), ">= 0"),
        (lambda: PrefillCurve.fit([(0, 0.1), (10, 0.2), (20, 0.3)]), "at least one token"),
        (lambda: PrefillCurve.fit([(10, 0.1), (20, 0.2)]), "at least 3 samples"),
        (lambda: PrefillCurve.fit([(10, 0.1), (20, 0.0), (30, 0.3)]), "seconds > 0"),
    ],
)
def test_bad_curves_and_samples_are_refused(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()
