"""The variant-rule replay: reads, served reads and variants made per creation rule, without a model."""
from dataclasses import replace

from bench.variant_rules import replay
from cluster.bench.workload import WorkloadRequest
from workers.chunks.variants import VariantRules


def _requests(*orders: str) -> list[WorkloadRequest]:
    return [WorkloadRequest(f"r{i}", "q?", tuple(f"doc {name}" for name in order)) for i, order in enumerate(orders)]


def test_a_recurring_context_is_served_from_its_first_repeat_or_its_second() -> None:
    stream = _requests("AB", "AB", "AB", "CB")
    eager = replay(stream, replace(VariantRules(), create_after_sightings=1))
    # B after A: made on first sight, served on both repeats; B after C: made, never served; A is never read after
    # a first chunk, B's first sight is computed in full
    assert eager == {"reads": 3, "served": 2, "made": 2, "dropped": 0, "served_per_made": 1.0}
    strict = replay(stream, VariantRules(create_after_sightings=2))
    assert strict == {"reads": 3, "served": 1, "made": 1, "dropped": 0, "served_per_made": 1.0}
    assert replay(_requests("AB", "CB"), VariantRules(create_after_sightings=2))["made"] == 0
