"""The planner on the real vLLM engine: calibrated on it, a plain plan is vLLM's exact prefill, and warms the chunks."""
import importlib.util
import time

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed in this environment", allow_module_level=True)

from workers.engines.base import BlendRequest  # noqa: E402
from workers.engines.calibration import calibrate_planner, synthetic_documents  # noqa: E402
from workers.engines.stages import ENGINE_WAIT  # noqa: E402
from workers.generation.sampling import SamplingParams  # noqa: E402
from workers.loading.planner import PlanCorrection, RequestPlanner  # noqa: E402
from workers.loading.request_plan import PrefillCosts, PrefillCurve  # noqa: E402

# Plain costs 1 s whatever the size; blending 0.5 s with every chunk cached, and each missed token at plain's cost.
FORCED = PrefillCosts("cacheblend", 0.15, PrefillCurve(1.0, 0.0, 0.0), PrefillCurve(0.5, 0.0, 0.0))


def _answer(engine, request):
    generation = engine.open(request)
    return list(generation), generation.stats


def test_calibration_times_both_plans_on_the_engine_itself(vllm_engine) -> None:
    costs = calibrate_planner(vllm_engine, "cacheblend", 0.15, context_tokens=(128, 256, 512))
    assert costs.prices("cacheblend", 0.15)
    # Prefilling more tokens never takes less time, on either plan, by the fitted curves.
    for curve in (costs.plain, costs.blend):
        assert 0 < curve.predict_s(300) <= curve.predict_s(600) <= curve.predict_s(1200)


def test_a_plain_plan_is_full_prefill_and_stores_the_missed_chunks_for_the_next_request(vllm_engine) -> None:
    documents = synthetic_documents(384)
    request = BlendRequest(documents, "How many lichens did survey 1.2 count?", "cacheblend", 0.15,
                           SamplingParams(max_new_tokens=8), namespace="planner-test")
    exact, _ = _answer(vllm_engine, BlendRequest(documents, request.question, "full_prefill", None,
                                                 request.sampling, namespace="planner-elsewhere"))
    vllm_engine.planner = RequestPlanner(FORCED)
    try:
        plain_tokens, plain = _answer(vllm_engine, request)  # every chunk missed: 0.5 s + 1 s > 1 s
        blended_tokens, blended = _answer(vllm_engine, request)  # stored after the plain answer: 0.5 s < 1 s
    finally:
        vllm_engine.planner = None
    assert plain.plan == "plain" and plain.mode == "full_prefill" and plain.predicted_ttft_s == pytest.approx(1.0)
    assert plain_tokens == exact and plain.reused_tokens == 0
    assert blended.plan == "blend" and blended.mode == "cacheblend" and blended.predicted_ttft_s == pytest.approx(0.5)
    assert blended.reused_tokens > 0 and len(blended_tokens) == 8


def test_requests_the_planner_did_not_measure_run_as_asked(vllm_engine) -> None:
    request = BlendRequest(synthetic_documents(256), "Which survey counted most mosses?", "cacheblend", 0.5,
                           SamplingParams(max_new_tokens=2), namespace="planner-test")
    vllm_engine.planner = RequestPlanner(FORCED)
    try:
        _, stats = _answer(vllm_engine, request)
    finally:
        vllm_engine.planner = None
    assert stats.plan == "blend" and stats.mode == "cacheblend" and stats.predicted_ttft_s is None


def test_the_wait_for_other_requests_work_is_not_held_against_the_plan(vllm_engine) -> None:
    documents = synthetic_documents(256)
    request = BlendRequest(documents, "Which survey counted most lichens?", "cacheblend", 0.15,
                           SamplingParams(max_new_tokens=2), namespace="planner-wait")
    vllm_engine.store_documents(documents, "planner-wait")
    for _ in range(2):  # no planner: what blending it takes on this machine (the second, warm)
        vllm_engine.forget_fused_contexts()  # else vLLM's prefix cache answers it and no plan is measured
        _, alone = _answer(vllm_engine, request)
    vllm_engine.forget_fused_contexts()
    blend_s = alone.ttft_s  # the curve; with weight 1 the factor is the last request's measured over it
    costs = PrefillCosts("cacheblend", 0.15, PrefillCurve(100.0, 0.0, 0.0), PrefillCurve(blend_s, 0.0, 0.0))
    planner = RequestPlanner(costs, PlanCorrection(weight=1.0))
    vllm_engine.planner = planner
    try:
        vllm_engine._loop.submit(lambda: time.sleep(2.0))  # the engine's thread busy with another request's work
        _, stats = _answer(vllm_engine, request)
    finally:
        vllm_engine.planner = None
    assert stats.plan == "blend" and stats.stages_s[ENGINE_WAIT] > 1.0
    own_s = stats.ttft_s - stats.stages_s[ENGINE_WAIT]
    step = planner.correction.max_step
    assert planner.correction.factor("blend") == pytest.approx(min(max(own_s / blend_s, 1 / step), step))
    assert planner.correction.factor("blend") < step  # the TTFT with the wait, > 2x the curve, would give step
