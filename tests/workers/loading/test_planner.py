"""The worker's planner: curves times running corrections, learned from the TTFT each served request measured."""
import math

import pytest

from workers.loading.planner import PlanCorrection, RequestPlanner
from workers.loading.request_plan import BLEND_PLAN, PLAIN_PLAN, PrefillCosts, PrefillCurve

# Plain 0.4 s, blending 0.3 s, whatever the size: blending wins until plain proves faster than its curve.
COSTS = PrefillCosts("cacheblend", 0.15, PrefillCurve(0.4, 0.0, 0.0), PrefillCurve(0.3, 0.0, 0.0))


def test_a_factor_moves_toward_measured_over_predicted_as_a_running_geometric_mean() -> None:
    correction = PlanCorrection(weight=0.5)
    correction.observe(PLAIN_PLAN, 0.8, 0.4)  # twice as slow as predicted
    assert correction.factor(PLAIN_PLAN) == pytest.approx(math.sqrt(2.0))
    correction.observe(PLAIN_PLAN, 0.8, 0.4)
    assert correction.factor(PLAIN_PLAN) == pytest.approx(2.0 ** 0.75)
    assert correction.factor(BLEND_PLAN) == 1.0  # the other plan's factor is its own


def test_the_planner_switches_plans_once_served_requests_show_its_curves_wrong() -> None:
    planner = RequestPlanner(COSTS, PlanCorrection(weight=1.0))
    first = planner.plan(1000, 0)
    assert first.name == BLEND_PLAN and first.predicted_ttft_s == pytest.approx(0.3)
    planner.observe(first, 0.6)  # blending ran at twice its curve: 0.6 s against plain's 0.4 s
    second = planner.plan(1000, 0)
    assert second.name == PLAIN_PLAN and second.predicted_ttft_s == pytest.approx(0.4)
    assert second.other_ttft_s == pytest.approx(0.6)
    planner.observe(second, 0.8)  # plain too: the factor is measured against the curve alone
    third = planner.plan(1000, 0)
    assert third.name == BLEND_PLAN and third.predicted_ttft_s == pytest.approx(0.6)
    assert third.curve_ttft_s == pytest.approx(0.3)


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="weight"):
        PlanCorrection(weight=0.0)
