"""The loading controller on hand-made delay models: free recompute, tail-aware tiers, recompute from scratch."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplane.tiers.latency import LoadQuantiles
from workers.fusion.base import FusionOptions
from workers.loading.delay_model import RecomputeDelayModel
from workers.loading.plan import (
    ChunkAction,
    ChunkPlacement,
    ControllerOptions,
    pipeline_ttft_s,
    plan_loading,
    predict_ttft_s,
    selected_per_layer,
)

# 10 us per recomputed token per layer: 1000 tokens in full take 10 ms a layer, the 15% floor 1.5 ms.
DELAYS = RecomputeDelayModel(num_layers=10, per_token_s=1e-5)
MS = 1e-3
GRADUAL = ControllerOptions.from_fusion(FusionOptions().with_gradual_filtering())


def _flat(seconds: float) -> LoadQuantiles:
    return LoadQuantiles(seconds, seconds, seconds)


def test_all_fast_tiers_give_the_floor_ratio() -> None:
    chunks = [ChunkPlacement(f"c{i}", 250, 4096, ("ram",)) for i in range(4)]
    plan = plan_loading(chunks, DELAYS, {"ram": _flat(1e-6)})
    assert plan.recompute_ratio == 0.15
    assert all(action.tier == "ram" for action in plan.actions) and plan.recomputed == ()
    assert plan.ttft_p50_s == plan.ttft_p95_s == plan.ttft_p99_s


def test_slow_tier_raises_the_ratio_to_what_loading_hides() -> None:
    # Two 500-token chunks at 2.5 ms a layer each: loading takes 5 ms a layer, which hides up to 500
    # recomputed tokens. With gradual filtering layer 2 recomputes 2r (the first filter keeps twice the ratio),
    # so r = 0.25 is the most it hides. Recomputing a whole chunk instead would add 5 ms of compute for 2.5 ms
    # of load.
    chunks = [ChunkPlacement(f"c{i}", 500, 4096, ("ssd",)) for i in range(2)]
    quantiles = {"ssd": _flat(2.5 * MS)}
    plan = plan_loading(chunks, DELAYS, quantiles, GRADUAL)
    assert plan.recomputed == ()
    assert plan.recompute_ratio == pytest.approx(0.25)
    floor = predict_ttft_s(chunks, plan.actions, 0.15, DELAYS, quantiles, "p95", GRADUAL)
    # Only the last layer, which no load overlaps, pays for the extra recompute.
    assert plan.ttft_p95_s == pytest.approx(floor + (250 - 150) * 1e-5)
    # One check layer (the default): no 2r bulge, so loading hides r = 0.5.
    assert plan_loading(chunks, DELAYS, quantiles).recompute_ratio == pytest.approx(0.5)
    # The floor holds however fast loading is, and a higher floor is honoured too.
    assert plan_loading(chunks, DELAYS, {"ssd": _flat(0.0)}, ControllerOptions(ratio_floor=0.3)).recompute_ratio == 0.3


def test_slack_trades_a_little_ttft_for_more_recompute() -> None:
    chunks = [ChunkPlacement(f"c{i}", 500, 4096, ("ssd",)) for i in range(2)]
    quantiles = {"ssd": _flat(2.5 * MS)}
    strict = plan_loading(chunks, DELAYS, quantiles)
    relaxed = plan_loading(chunks, DELAYS, quantiles, ControllerOptions(free_slack=0.1))
    assert relaxed.recompute_ratio > strict.recompute_ratio
    # The slack bounds the overlapped layers; the last layer adds its own extra recompute on top.
    last_layer_extra = (relaxed.recompute_ratio - strict.recompute_ratio) * 1000 * 1e-5
    assert relaxed.ttft_p95_s <= strict.ttft_p95_s * 1.1 + last_layer_extra + 1e-12


def test_a_tier_with_a_good_mean_but_a_bad_tail_is_avoided() -> None:
    quantiles = {"remote": LoadQuantiles(0.2 * MS, 8 * MS, 30 * MS), "ssd": LoadQuantiles(0.5 * MS, 0.8 * MS, 1 * MS)}
    chunks = [ChunkPlacement(f"c{i}", 250, 4096, ("remote", "ssd")) for i in range(4)]
    plan = plan_loading(chunks, DELAYS, quantiles)
    assert {action.tier for action in plan.actions} == {"ssd"}
    median_first = plan_loading(chunks, DELAYS, quantiles, ControllerOptions(objective="p50"))
    assert {action.tier for action in median_first.actions} == {"remote"}
    median_first_p95_s = predict_ttft_s(
        chunks, median_first.actions, plan.recompute_ratio, DELAYS, quantiles, "p95", ControllerOptions()
    )
    assert plan.ttft_p95_s < median_first_p95_s


def test_a_chunk_slower_to_load_than_to_compute_is_recomputed() -> None:
    quantiles = {"ram": _flat(1e-6), "s3": LoadQuantiles(20 * MS, 50 * MS, 80 * MS)}
    chunks = [
        ChunkPlacement("local", 400, 4096, ("ram",)),
        ChunkPlacement("far", 100, 4096, ("s3",)),  # 1 ms a layer to compute, 50 ms at p95 to load
        ChunkPlacement("miss", 100, 4096),
    ]
    plan = plan_loading(chunks, DELAYS, quantiles, forced_tokens=20)
    assert plan.tier_of("local") == "ram"
    assert plan.recomputed == ("far", "miss")
    assert plan.recompute_ratio == 0.15
    loaded_far = [ChunkAction("local", "ram"), ChunkAction("far", "s3"), ChunkAction("miss", None)]
    assert plan.ttft_p95_s < predict_ttft_s(chunks, loaded_far, 0.15, DELAYS, quantiles, "p95", ControllerOptions(), 20)


def test_pipeline_overlaps_loading_the_next_layer_with_computing_this_one() -> None:
    assert pipeline_ttft_s([1.0, 1.0, 1.0], [0.5, 2.0, 0.5]) == pytest.approx(1.0 + 1.0 + 2.0 + 0.5)
    assert pipeline_ttft_s([], []) == 0.0
    with pytest.raises(ValueError, match="one load and one compute"):
        pipeline_ttft_s([1.0], [])


def test_selected_tokens_follow_the_filter_schedule() -> None:
    assert selected_per_layer(5, 0.15, 1000, 20, GRADUAL) == [1020, 1020, 320, 170, 170]  # 2r at layer 1, r at 2
    assert selected_per_layer(3, 0.6, 100, 0, GRADUAL) == [100, 100, 100]
    assert selected_per_layer(5, 0.15, 1000, 20, ControllerOptions()) == [1020, 1020, 170, 170, 170]  # r from 1 on


def test_options_follow_the_fusion_mode_and_are_validated() -> None:
    options = ControllerOptions.from_fusion(FusionOptions(recompute_ratio=0.2, filter_layers=(1, 3),
                                                          filter_multipliers=(3.0, 1.0)), ratio_step=0.1)
    assert (options.ratio_floor, options.filter_layers, options.ratio_step) == (0.2, (1, 3), 0.1)
    assert options.ratios() == pytest.approx([0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    assert ControllerOptions(ratio_floor=0.15, ratio_ceiling=0.4, ratio_step=0.1).ratios() == [0.15, 0.25, 0.35, 0.4]
    for kwargs, message in [
        ({"ratio_floor": 0.5, "ratio_ceiling": 0.4}, "ratio_floor"),
        ({"ratio_step": 0.0}, "ratio_step"),
        ({"objective": "mean"}, "objective"),
        ({"free_slack": -0.1}, "free_slack"),
        ({"filter_layers": (2, 1), "filter_multipliers": (2.0, 1.0)}, "ascending"),
        ({"filter_multipliers": (2.0, 1.0)}, "equal length"),
    ]:
        with pytest.raises(ValueError, match=message):
            ControllerOptions(**kwargs)
    with pytest.raises(ValueError, match="num_tokens"):
        ChunkPlacement("x", 0, 10)
    with pytest.raises(ValueError, match="no load quantiles"):
        plan_loading([ChunkPlacement("x", 10, 10, ("nvme",))], DELAYS, {})


_quantiles = st.tuples(*(st.floats(0.0, 20 * MS) for _ in range(3))).map(lambda q: LoadQuantiles(*sorted(q), 4096))


@settings(max_examples=60, deadline=None)
@given(
    tiers=st.fixed_dictionaries({"ram": _quantiles, "ssd": _quantiles, "remote": _quantiles}),
    chunks=st.lists(
        st.tuples(st.integers(1, 600), st.integers(1024, 16384), st.sets(st.sampled_from(["ram", "ssd", "remote"]))),
        min_size=0, max_size=6,
    ),
    floor=st.floats(0.0, 1.0),
    forced=st.integers(0, 50),
)
def test_plans_respect_the_floor_and_beat_the_naive_plan(tiers, chunks, floor, forced) -> None:
    placements = [ChunkPlacement(f"c{i}", n, b, tuple(sorted(held))) for i, (n, b, held) in enumerate(chunks)]
    options = ControllerOptions(ratio_floor=floor)
    plan = plan_loading(placements, DELAYS, tiers, options, forced)
    assert options.ratio_floor <= plan.recompute_ratio <= 1.0
    assert plan.ttft_p50_s <= plan.ttft_p95_s <= plan.ttft_p99_s
    assert [action.key for action in plan.actions] == [chunk.key for chunk in placements]
    # Naive: every held chunk from its best-median tier, at the floor ratio.
    naive = [ChunkAction(c.key, min(c.tiers, key=lambda t: tiers[t].p50_s) if c.tiers else None) for c in placements]
    naive_p95 = predict_ttft_s(placements, naive, options.ratio_floor, DELAYS, tiers, "p95", options, forced)
    at_floor = predict_ttft_s(placements, plan.actions, options.ratio_floor, DELAYS, tiers, "p95", options, forced)
    assert at_floor <= naive_p95 * (1 + 1e-9)
