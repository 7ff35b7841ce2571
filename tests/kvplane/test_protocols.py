"""Every policy and tier kind answers its Protocol's whole interface, so the store calls it without probing."""
from pathlib import Path

import pytest

from kvplane.eviction.policy import POLICIES, make_policy
from kvplane.eviction.slot_share import SlotSharePolicy
from kvplane.tiers.fs import FsspecTier
from kvplane.tiers.jitter import JitterConfig, JitterTier
from kvplane.tiers.latency import LoadQuantiles, LoadTelemetry, TimedTier
from kvplane.tiers.memory import MemoryTier
from kvplane.tiers.tier import Tier


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_takes_a_chunk_impact(name: str) -> None:
    capacity_bytes = 1 << 20
    wrapped = SlotSharePolicy(make_policy(name, capacity_bytes), capacity_bytes)
    for policy in (make_policy(name, capacity_bytes), make_policy(name, capacity_bytes, 0.5), wrapped):
        assert policy.admit("a", 100, 1.0) == []
        policy.note_impact("a", 0.5)  # weighed by impact_tinylfu, ignored by the others
        assert policy.contains("a") == (name != "passthrough")  # nothing else changed by it


def test_every_tier_kind_answers_sweeps_and_labels(tmp_path: Path) -> None:
    memory = MemoryTier("ram", 1 << 20)
    tiers: list[Tier] = [
        memory,
        FsspecTier("object", 1 << 20, f"memory://{tmp_path.name}"),
        JitterTier(MemoryTier("jittered", 1 << 20), JitterConfig(median_s=0.0)),
        TimedTier(MemoryTier("timed", 1 << 20), LoadTelemetry({}, LoadQuantiles(0.001, 0.002, 0.003))),
    ]
    for tier in tiers:
        assert tier.sweep_temporaries(0.0) == 0  # nothing of an unfinished write is ever left behind here
        assert tier.hit_label() is None  # no inner tiers
        assert tier.label_of("absent") == tier.name  # its own name, unasked: the store asks its policy or the tier
