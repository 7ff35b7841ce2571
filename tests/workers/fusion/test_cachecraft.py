"""Cache-Craft: chunk impact, the question's focus, early termination and placement on the real model (float32)."""
import pytest
import torch

from workers.chunks.kv import ChunkLayers
from workers.engines.torch_engine import TorchEngine
from workers.fusion.base import CraftOptions, FusionOptions
from workers.fusion.cachecraft import CacheCraft, CraftPlan, chunk_context_impact, chunk_focus, chunk_share
from workers.fusion.craft_placement import place_pooled
from workers.fusion.layout import CHUNK, BlendLayout, Segment
from workers.fusion.selective_pass import LayerStep
from workers.generation.prompt import PromptLayout
from workers.model.checkpoint import Checkpoint


def test_chunk_share_is_none_below_all_above_and_proportional_between() -> None:
    share = lambda cci: chunk_share(cci, 0.15, 0.4, reuse_below=0.1, full_above=0.9)  # noqa: E731
    assert share(0.05) == 0.0 and share(0.95) == 1.0 and share(0.9) == 1.0
    assert share(0.4) == pytest.approx(0.15) and share(0.8) == pytest.approx(0.3)  # r x CCI / mean CCI
    assert chunk_share(0.8, 0.9, 0.2, reuse_below=0.1, full_above=0.95) == 1.0  # capped at the whole chunk


def _keys(prefix: float, first: float, second: float) -> torch.Tensor:
    """Keys along one direction: 4 prefix tokens, then two chunks of 4 tokens. # [12, 1, 2]"""
    scale = torch.tensor([prefix] * 4 + [first] * 4 + [second] * 4)
    return torch.stack([scale, torch.zeros(12)], dim=1)[:, None, :]


CHUNKS = [Segment(4, 8, CHUNK), Segment(8, 12, CHUNK)]
QUERIES = torch.tensor([[1.0, 0.0]]).expand(12, 2)[:, None, :]  # [12, 1, 2]: every query looks along that direction


def test_the_prompt_prefix_is_not_inter_chunk_context() -> None:
    # Every query attends mostly to the prefix (the attention sink); the second chunk barely to the first.
    impact = chunk_context_impact(QUERIES, _keys(prefix=6.0, first=-20.0, second=0.0), CHUNKS, num_queries=4)
    assert impact[0] == 0.0  # nothing but the prefix before it: its cached KV (computed after the prefix) is exact
    assert impact[1] < 0.01  # the prefix's attention counted as inter would make this ~1


def test_attention_to_an_earlier_chunk_is_inter() -> None:
    impact = chunk_context_impact(QUERIES, _keys(prefix=6.0, first=0.0, second=0.0), CHUNKS, num_queries=4)
    assert impact[0] == 0.0
    # equal keys: a query of the second chunk at offset i sees 4 earlier-chunk keys and i + 1 of its own
    expected = sum(4 / (4 + i + 1) for i in range(4)) / 4
    assert torch.isclose(impact[1], torch.tensor(expected), atol=1e-5)


def test_focus_is_the_attention_share_over_the_token_share() -> None:
    chunks = [Segment(2, 6, CHUNK), Segment(6, 8, CHUNK)]
    attention = torch.zeros(2, 10)
    attention[:, 0] = 5.0  # the sink: not a chunk, left out
    attention[0, 2:6], attention[0, 6:8] = 0.1, 0.2  # layer 0: 0.4 vs 0.4
    attention[1, 2:6], attention[1, 6:8] = 0.0, 1.0  # layer 1: all on the second chunk (counts as much as layer 0)
    focus = chunk_focus(attention, chunks)
    # shares of attention 0.25 and 0.75 against token shares 2/3 and 1/3
    torch.testing.assert_close(focus, torch.tensor([0.25 / (2 / 3), 0.75 / (1 / 3)]))


def test_past_the_stop_layer_only_chunks_out_of_focus_are_dropped() -> None:
    prompt = PromptLayout([1] * 4, [[2] * 4, [3] * 4, [5] * 4], [4] * 2)  # chunks at 4, 8, 12; question 16-18
    cached = [ChunkLayers(ids, iter(()), 1, base_position=4) for ids in prompt.chunk_ids]
    layout = BlendLayout.build(prompt, cached, ChunkLayers([1] * 4, iter(()), 1))
    unfocused = torch.zeros(18, dtype=torch.bool)
    unfocused[8:12] = True  # the second chunk
    plan = CraftPlan(layout.chunk_segments(), [0.0, 0.3, 0.3], unfocused, {})
    craft = CacheCraft(FusionOptions(craft=CraftOptions(stop_after=2)))
    positions = torch.tensor([9, 10, 13, 16, 17])  # what the filter layer kept
    step = lambda layer: LayerStep(layer, positions, *[torch.zeros(5, 1, 2)] * 3, None, layout)  # noqa: E731
    assert craft._narrow(step(3), 0.15, plan) is None  # not the stop layer: nothing changes
    assert positions[craft._narrow(step(2), 0.15, plan)].tolist() == [13, 16, 17]


def test_with_every_impact_stored_the_plan_is_made_up_front_from_the_question() -> None:
    prompt = PromptLayout([1] * 4, [[2] * 8, [3] * 8, [5] * 8], [4] * 2)  # chunks at 4, 12, 20; question 28-30
    cached = [ChunkLayers(ids, iter(()), 1, base_position=4) for ids in prompt.chunk_ids]
    layout = BlendLayout.build(prompt, cached, ChunkLayers([1] * 4, iter(()), 1))
    relevance = torch.zeros(30)
    relevance[[14, 15, 21]] = 1.0  # the question reads these most
    plan = CraftPlan(layout.chunk_segments(), [0.0, 0.4, 0.2], torch.zeros(30, dtype=torch.bool), {}, relevance)
    options = FusionOptions(selection_span_tokens=1, craft=CraftOptions(cci_reuse_below=0.01, cci_full_above=0.9))
    craft = CacheCraft(options)
    # mean impact 0.2: the second chunk recomputes 0.25 x 0.4 / 0.2 = half (4 tokens), the third a quarter (2)
    chosen = craft.upfront(layout, plan, 0.25).tolist()
    assert {14, 15} <= set(chosen) and sum(12 <= p < 20 for p in chosen) == 4
    assert 21 in chosen and sum(20 <= p < 28 for p in chosen) == 2
    assert chosen[-2:] == [28, 29] and all(p >= 12 for p in chosen)  # the question; nothing exact


@pytest.mark.slow
def test_early_termination_stops_recomputing_chunks_out_of_focus(
    checkpoint: Checkpoint, qa_records: list[dict]
) -> None:
    engine = TorchEngine.from_checkpoint(checkpoint)
    runner = engine.fuser.runner
    for name, stop, below in (("off", None, 0.8), ("on", 2, 0.8), ("nothing_out", 2, 0.0)):
        options = FusionOptions(craft=CraftOptions(stop_after=stop, focus_below=below, stored_impact=False))
        engine.fuser.modes[name] = CacheCraft(options)
    record = qa_records[0]
    prompt = engine.fuser.layout(record["documents"], record["question"])
    engine.fuser.precompute(prompt)
    fused = {name: engine.fuser.fuse(prompt, name, 0.15) for name in ("off", "on", "nothing_out")}
    reused = engine.fuser.fuse(prompt, "full_reuse", 0.0)  # the cached context in place, as the scout sees it
    plan = engine.fuser.modes["on"].plan(runner, reused.layout, reused.cache, None)
    out = [seg for seg in plan.chunks if bool(plan.unfocused[seg.start : seg.end].any())]
    assert 0 < len(out) < len(plan.chunks)  # the question reads the last chunk most (focus 0.52, 0.75, 1.46)
    # past layer 2 the chunks out of focus are dropped: less work, and nothing changes without any
    work = {name: f.prefill.recomputed_token_layers for name, f in fused.items()}
    assert work["on"] < work["off"] == work["nothing_out"]
    torch.testing.assert_close(fused["nothing_out"].prefill.last_hidden, fused["off"].prefill.last_hidden)
    assert fused["on"].prefill.chunk_impacts == fused["off"].prefill.chunk_impacts  # measured at layer 1 either way
    assert len(fused["on"].prefill.chunk_impacts) == 2  # the first chunk is exact: neither computed nor measured


@pytest.mark.slow  # the default run keeps make test within 15 minutes; the placement itself is unit-tested above
def test_pooled_placement_spends_the_same_budget_where_the_question_reads(
    engine: TorchEngine, qa_records: list[dict]
) -> None:
    calls: dict[str, tuple] = {}
    for name in ("per_chunk", "pooled"):
        mode = CacheCraft(FusionOptions(craft=CraftOptions(placement=name, stop_after=None, stored_impact=False)))
        place = mode.place
        mode.place = lambda *args, place=place, name=name: calls.setdefault(name, (args, place(*args)))[1]  # type: ignore[misc]
        engine.fuser.modes[name] = mode
    record = qa_records[0]
    prompt = engine.fuser.layout(record["documents"], record["question"])
    engine.fuser.precompute(prompt)
    fused = {name: engine.fuser.fuse(prompt, name, 0.3) for name in ("per_chunk", "pooled")}
    assert fused["pooled"].prefill.chunk_impacts == fused["per_chunk"].prefill.chunk_impacts  # both measured at layer 1
    (_, chunks, shares, _), pooled = calls["pooled"]
    assert calls["per_chunk"][0][2] == shares and 0.0 < sum(shares) < len(shares)  # the same shares, in part
    # the same number of tokens past layer 1, give or take a 16-token span's rounding
    assert abs(int(pooled.sum()) - int(calls["per_chunk"][1].sum())) <= 2 * 16
    # ranked by the question's attention over every layer, scouted over the cached context (not by KV deviation)
    reused = engine.fuser.fuse(prompt, "full_reuse", 0.0)
    relevance = engine.fuser.modes["pooled"].plan(engine.fuser.runner, reused.layout, reused.cache, None).relevance
    assert relevance is not None
    assert torch.equal(pooled, place_pooled(relevance, chunks, shares, 16))
    assert not torch.equal(pooled, place_pooled(calls["per_chunk"][0][0], chunks, shares, 16))
