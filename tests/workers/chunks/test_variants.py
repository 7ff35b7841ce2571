"""Chunk variants: the overlap score with its order penalty, the bound, when to make one; exact reuse (real model)."""
import pytest
import torch

from workers.chunks.variants import Variant, VariantIndex, VariantRules, chunk_keys, overlap_score
from workers.fuser import FusedPrompt, Fuser
from workers.fusion.base import CraftOptions, FusionOptions
from workers.generation.prompt import PromptLayout
from workers.model.runner import ModelRunner


def test_overlap_counts_shared_chunks_over_all_and_penalises_order() -> None:
    assert overlap_score(["a", "b"], ["a", "b"]) == 1.0
    assert overlap_score(["a", "b"], ["c"]) == 0.0
    assert overlap_score(["a", "b", "c", "d"], ["a", "b"]) == pytest.approx(0.5)  # half the request's context
    assert overlap_score(["a", "b"], ["a", "b", "x", "y"]) == pytest.approx(0.5)  # chunks the request lacks count
    assert overlap_score(["b", "a"], ["a", "b"]) == pytest.approx(0.5)  # the one pair swapped: weight 0.5
    assert overlap_score(["b", "a"], ["a", "b"], order_weight=0.0) == 1.0
    # three shared, one of three pairs in another order
    assert overlap_score(["a", "c", "b"], ["a", "b", "c"]) == pytest.approx(1.0 - 0.5 / 3)
    assert overlap_score([], ["a"]) == 0.0


def test_the_best_fitting_variant_is_served_if_it_fits_well_enough() -> None:
    index = VariantIndex(VariantRules(min_score=0.5))
    assert index.best("k", ["a"]) is None
    index.add("k", Variant(("a", "b"), (1, 2)))
    index.add("k", Variant(("c",), (3,)))
    found = index.best("k", ["a", "b"])
    assert found is not None and found[0].context_ids == (1, 2) and found[1] == 1.0
    assert index.best("k", ["x", "c", "y"]) is None  # 1/3 < 0.5
    assert index.best("other", ["a", "b"]) is None


def test_variants_per_chunk_are_bounded_dropping_the_least_used() -> None:
    index = VariantIndex(VariantRules(max_per_chunk=2))
    assert index.add("k", Variant(("a",), (1,))) is None
    assert index.add("k", Variant(("b",), (2,))) is None
    index.best("k", ["a"])  # "a" has been used, "b" not
    dropped = index.add("k", Variant(("c",), (3,)))
    assert dropped is not None and dropped.before == ("b",) and index.count("k") == 2


def test_a_variant_is_made_only_for_a_reached_chunk_no_variant_fits() -> None:
    index = VariantIndex(VariantRules(create_above=0.3, create_after_sightings=1))
    assert not index.worth_creating("k", [], 0.9)  # first chunk: its KV after the prefix is already exact
    assert not index.worth_creating("k", ["a"], 0.1)  # the context barely reaches it
    assert index.worth_creating("k", ["a"], 0.5)
    index.add("k", Variant(("a",), (1,)))
    assert not index.worth_creating("k", ["a"], 0.5)  # a perfect fit exists
    assert index.worth_creating("k", ["b", "a"], 0.5)
    with pytest.raises(ValueError):
        VariantRules(max_per_chunk=0)


def test_a_variant_is_made_only_once_its_preceding_chunks_recur() -> None:
    index = VariantIndex(VariantRules(create_above=0.3, create_after_sightings=2, sightings_per_chunk=2))
    assert not index.worth_creating("k", ["a", "b"], 0.9)  # first sight of this context
    assert not index.worth_creating("k", ["c"], 0.9)  # another context, fits the first at 0
    assert index.worth_creating("k", ["b", "a"], 0.9)  # fits the first at 0.5 (same chunks, other order)
    assert not index.worth_creating("j", ["a", "b"], 0.9)  # sightings are per chunk
    assert not index.worth_creating("k", ["d"], 0.1)  # a weak impact makes none, but the sighting counts
    assert not index.worth_creating("k", ["e"], 0.9)
    assert index.worth_creating("k", ["d"], 0.9)
    assert not index.worth_creating("k", ["c"], 0.9)  # only the latest 2 contexts are remembered: ["c"] was not
    for name in ("create_after_sightings", "sightings_per_chunk", "max_tracked_chunks"):
        with pytest.raises(ValueError):
            VariantRules(**{name: 0})


def test_sightings_are_forgotten_for_the_least_recently_seen_chunk_past_the_bound() -> None:
    index = VariantIndex(VariantRules(create_after_sightings=2, max_tracked_chunks=2))
    for key in ("x", "y", "x", "z"):  # z's first sight forgets y (x was seen since)
        index.worth_creating(key, ["a"], 0.9)
    assert not index.worth_creating("y", ["a"], 0.9)
    assert index.worth_creating("z", ["a"], 0.9)


def _fuser_with_variants_due(runner: ModelRunner, record: dict) -> tuple[Fuser, PromptLayout, FusedPrompt]:
    """A Fuser that keeps variants, the record's prompt, and a cachecraft pass whose write-back makes them."""
    rules = VariantRules(create_above=0.0, create_after_sightings=1)
    fuser = Fuser(runner, FusionOptions(craft=CraftOptions(stop_after=None)), variants=VariantIndex(rules))
    prompt = fuser.layout(record["documents"], record["question"])
    fuser.precompute(prompt)
    fuser.fuse(prompt, "cachecraft", 0.15)  # measures and stores the chunks' impacts; no write-back
    return fuser, prompt, fuser.fuse(prompt, "cachecraft", 0.15)


def test_an_evicted_variant_falls_back_to_the_chunk(runner: ModelRunner, qa_records: list[dict]) -> None:
    fuser, prompt, first = _fuser_with_variants_due(runner, qa_records[0])
    fuser.write_back(first, prompt)
    keys = chunk_keys(fuser.store, prompt.chunk_ids, prompt.prefix_ids, "default")
    for index in (1, 2):  # a bounded store evicts both variants; the index still lists them
        variant, _ = fuser.variants.best(keys[index], keys[:index])
        fuser.store.delete(prompt.chunk_ids[index], list(variant.context_ids))
    again = fuser.fuse(prompt, "cachecraft", 0.15)
    assert not again.missed  # read from each chunk's own KV, not recomputed as a miss
    assert [seg.cached.variant_score for seg in again.layout.chunk_segments()] == [0.0, 0.0, 0.0]


@pytest.mark.slow
def test_a_variant_made_after_a_request_serves_the_same_context_exactly(
    runner: ModelRunner, qa_records: list[dict]
) -> None:
    fuser, prompt, first = _fuser_with_variants_due(runner, qa_records[0])
    assert not first.prefill.chunk_impacts  # planned up front from the stored impacts: it measures none
    assert not first.missed and fuser.has_write_back(first)  # every chunk was stored, yet variants are due
    fuser.write_back(first, prompt)  # so variants are made from the stored impacts
    keys = chunk_keys(fuser.store, prompt.chunk_ids, prompt.prefix_ids, "default")
    assert [fuser.variants.count(key) for key in keys] == [0, 1, 1]  # the first chunk's KV is exact already
    second = fuser.fuse(prompt, "cachecraft", 0.15)
    assert [seg.cached.variant_score for seg in second.layout.chunk_segments()] == [0.0, 1.0, 1.0]
    assert second.layout.exact_end() == second.layout.num_context_tokens  # KV after this very context: exact
    assert second.prefill.recomputed_token_layers == 0
    full = fuser.fuse(prompt, "full_prefill", 1.0)
    logprobs = [runner.logits(f.prefill.last_hidden[None])[0].log_softmax(-1) for f in (second, full)]
    torch.testing.assert_close(logprobs[0], logprobs[1], atol=2e-3, rtol=0.0)
