"""Chunk impact kept beside the chunk: a running mean over uses, found again at lookup, acted on before the pass."""
import pytest
import torch

from workers.chunks.impact import ChunkImpact, ImpactBook
from workers.chunks.kv import ChunkKV, ChunkLayers
from workers.chunks.lookup import lookup_layout
from workers.chunks.sources import ChunkSources
from workers.chunks.store import LocalChunkStore, record_impact, stored_impact
from workers.engines.torch_engine import TorchEngine
from workers.fusion.base import CraftOptions, FusionOptions
from workers.fusion.cachecraft import CacheCraft, CraftPlan
from workers.fusion.layout import BlendLayout
from workers.generation.prompt import PromptLayout
from workers.model.checkpoint import Checkpoint


def test_the_impact_is_a_running_mean_over_uses() -> None:
    book = ImpactBook(max_entries=2)
    assert book.get("a") is None
    for value in (0.2, 0.4, 0.9):
        book.observe("a", value)
    found = book.get("a")
    assert found is not None and found.mean == pytest.approx(0.5) and found.uses == 3
    assert book.observe("b", 1.7) == ChunkImpact(1.0, 1)  # clamped to [0, 1]
    book.observe("c", 0.1)  # past max_entries the least recently measured goes
    assert book.get("a") is None and len(book) == 2
    with pytest.raises(ValueError):
        ChunkImpact(0.5, 0)


def test_a_stored_impact_travels_with_the_chunk_at_lookup() -> None:
    store = LocalChunkStore()
    prompt = PromptLayout([1, 1], [[2, 2, 2], [3, 3, 3]], [4])
    for ids in prompt.chunk_ids:
        store.put(ChunkKV(ids, torch.zeros(1, 2, 3, 1, 2), base_position=2), prompt.prefix_ids)
    record_impact(store, [3, 3, 3], prompt.prefix_ids, "default", 0.3)
    record_impact(store, [3, 3, 3], prompt.prefix_ids, "default", 0.1)
    assert stored_impact(store, [3, 3, 3], prompt.prefix_ids, "default") == pytest.approx(0.2)
    assert stored_impact(store, [3, 3, 3], [], "default") is None  # KV after another context: another chunk
    layout = lookup_layout(store, prompt, sources=ChunkSources("prefix"), namespace="default", recompute_ratio=0.15)
    impacts = [seg.cached.impact for seg in layout.layout.chunk_segments()]
    assert impacts[0] is None and impacts[1] == pytest.approx(0.2)
    plain = LocalChunkStore()
    record_impact(plain, [3], [], "default", 0.5)  # a store whose keeping ignores impacts still keeps the record
    assert stored_impact(plain, [3], [], "default") == pytest.approx(0.5) and len(plain) == 0


def test_chunks_whose_stored_impact_needs_no_recompute_are_computed_at_no_layer() -> None:
    prompt = PromptLayout([1] * 4, [[2] * 4, [3] * 4, [5] * 4], [4] * 2)  # chunks at 4, 8, 12; question 16-18
    cached = [ChunkLayers(ids, iter(()), 1, base_position=4) for ids in prompt.chunk_ids]
    layout = BlendLayout.build(prompt, cached, ChunkLayers([1] * 4, iter(()), 1))
    craft = CacheCraft(FusionOptions(craft=CraftOptions(cci_reuse_below=0.05)))
    plan = CraftPlan(layout.chunk_segments(), [0.0, 0.01, None], torch.zeros(18, dtype=torch.bool), {})
    # the prefix and the first chunk are exact, the second chunk's stored impact is below 0.05
    assert craft.initial_positions(layout, plan).tolist() == list(range(12, 18))


@pytest.mark.slow
def test_cachecraft_stores_what_it_measures_and_uses_it_next_time(
    checkpoint: Checkpoint, qa_records: list[dict]
) -> None:
    options = FusionOptions(craft=CraftOptions(cci_reuse_below=0.99, cci_full_above=1.0, stop_after=None))
    engine = TorchEngine.from_checkpoint(checkpoint, options)
    record = qa_records[0]
    prompt = engine.fuser.layout(record["documents"], record["question"])
    engine.fuser.precompute(prompt)
    first = engine.fuser.fuse(prompt, "cachecraft", 0.15)
    book = engine.fuser.store.impacts
    assert len(book) == len(first.prefill.chunk_impacts) == 2  # the first chunk is exact: not measured
    assert all(value < 0.99 for value in first.prefill.chunk_impacts.values())  # so reused: nothing to recompute
    starts = [len(prompt.prefix_ids) + sum(map(len, prompt.chunk_ids[:i])) for i in range(len(prompt.chunk_ids))]
    want = [first.prefill.chunk_impacts.get(start) for start in starts]
    assert engine.fuser.stored_impacts(prompt) == pytest.approx(want)  # None for the exact first chunk
    again = engine.fuser.fuse(prompt, "cachecraft", 0.15)
    assert again.prefill.chunk_impacts == {}  # known before the pass, never computed, so not measured again
    assert again.prefill.recomputed_token_layers < first.prefill.recomputed_token_layers
    assert again.prefill.recomputed_token_layers == 0  # only the question was computed: no context token
