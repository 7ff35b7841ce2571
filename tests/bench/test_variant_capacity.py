"""The bounded-store variant replay: reads by outcome and the work they cost, without a model."""
import pytest

from bench.variant_capacity import digest, replay
from cluster.bench.workload import WorkloadRequest
from workers.chunks.variants import VariantRules


def _requests(*orders: str) -> list[WorkloadRequest]:
    return [WorkloadRequest(f"r{i}", "q?", tuple(f"doc {name}" for name in order)) for i, order in enumerate(orders)]


TOKENS = {digest(f"doc {name}"): 100 for name in "ABC"}


def test_with_room_for_everything_a_recurring_context_is_read_from_its_variant() -> None:
    stream = _requests("AB", "AB", "AB")
    plain = replay(stream, TOKENS, 10_000, None, hit_share=0.2)
    assert (plain["misses"], plain["base_hits"], plain["variant_reads"]) == (2, 4, 0)
    # B after A is made on the second sighting and read on the third request: exact, nothing recomputed there
    kept = replay(stream, TOKENS, 10_000, VariantRules(create_after_sightings=2), hit_share=0.2)
    assert (kept["misses"], kept["base_hits"], kept["variant_reads"], kept["made"]) == (2, 3, 1, 1)
    assert plain["work_share"] == pytest.approx((200 + 4 * 100 * 0.2) / 600, abs=1e-4)
    assert kept["work_share"] == pytest.approx((200 + 3 * 100 * 0.2) / 600, abs=1e-4)


def test_at_a_tight_capacity_admission_keeps_the_base_chunks_over_a_new_variant() -> None:
    # room for two entries: A and B, each read on every request, outscore the variant of B after A, made once
    stream = _requests("AB", "AB", "AB", "AB")
    plain = replay(stream, TOKENS, 250, None, hit_share=0.2)
    kept = replay(stream, TOKENS, 250, VariantRules(create_after_sightings=2), hit_share=0.2)
    assert (plain["misses"], plain["base_hits"]) == (2, 6)
    assert (kept["made"], kept["variant_reads"], kept["variants_held_at_end"]) == (1, 0, 0)
    assert (kept["misses"], kept["base_hits"]) == (2, 6)  # nothing lost: the variant was refused, not a base chunk
