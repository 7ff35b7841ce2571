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
    # blending's factor (2) went 5% of the way back to its curve's, in log terms, as plain was measured
    assert third.name == BLEND_PLAN and third.predicted_ttft_s == pytest.approx(0.3 * 2.0 ** 0.95)
    assert third.curve_ttft_s == pytest.approx(0.3)


def test_one_stalled_request_moves_a_factor_by_at_most_max_step() -> None:
    correction = PlanCorrection(weight=0.5, max_step=2.0)
    correction.observe(BLEND_PLAN, 8.0, 1.0)  # eight times its prediction: counted as twice
    assert correction.factor(BLEND_PLAN) == pytest.approx(math.sqrt(2.0))
    correction.observe(BLEND_PLAN, 0.01, 1.0)  # a hundredth: counted as half
    assert correction.factor(BLEND_PLAN) == pytest.approx(2.0 ** -0.25)


def test_a_plan_that_lost_to_stalled_requests_is_tried_again() -> None:
    # Blended requests stalled (1.3 s against 0.3 s): plain wins, and then runs at its curve every time.
    planner = RequestPlanner(COSTS, PlanCorrection(weight=0.5))
    stalled = planner.plan(1000, 0)
    planner.observe(stalled, 1.3)
    planner.observe(stalled, 1.3)  # two such requests in flight together
    plans = []
    for _ in range(40):
        plan = planner.plan(1000, 0)
        plans.append(plan.name)
        planner.observe(plan, plan.curve_ttft_s)  # each plan measures what its curve says
    assert plans[0] == PLAIN_PLAN and plans[-1] == BLEND_PLAN  # blending is back, its factor forgotten
    assert plans.index(BLEND_PLAN) < 20


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="weight"):
        PlanCorrection(weight=0.0)
    with pytest.raises(ValueError, match="max_step"):
        PlanCorrection(max_step=1.0)
    with pytest.raises(ValueError, match="forget"):
        PlanCorrection(forget=1.0)
