"""Impact-aware TinyLFU as pure bookkeeping: frequency weighed with how much of a chunk a read can reuse."""
import pytest

from kvplane.eviction.impact_lfu import ImpactTinyLFUPolicy
from kvplane.eviction.policy import make_policy
from kvplane.eviction.tinylfu import TinyLFUPolicy
from kvplane.store import TieredStore
from kvplane.tiers.spec import TierSpec


def _fill_hot(policy: TinyLFUPolicy, impact: float | None) -> None:
    """Ten 10-byte keys read three times each fill a 100-byte main area; their impact told when given."""
    for i in range(10):
        policy.admit(f"hot{i}", 10, 1.0)
        if impact is not None and isinstance(policy, ImpactTinyLFUPolicy):
            policy.note_impact(f"hot{i}", impact)
    for _ in range(3):
        for i in range(10):
            policy.touch(f"hot{i}")


def test_without_impacts_it_decides_as_tinylfu() -> None:
    plain, aware = TinyLFUPolicy(100, window_fraction=0.1), ImpactTinyLFUPolicy(100, window_fraction=0.1)
    for policy in (plain, aware):
        _fill_hot(policy, None)
    for i in range(50):
        for policy in (plain, aware):
            if i % 3 == 0:
                policy.touch(f"new{i}")
        assert plain.admit(f"new{i}", 10, 1.0) == aware.admit(f"new{i}", 10, 1.0)


def test_a_chunk_that_always_needs_heavy_recompute_gives_way_to_a_reusable_one() -> None:
    plain, aware = TinyLFUPolicy(100, window_fraction=0.0), ImpactTinyLFUPolicy(100, window_fraction=0.0)
    for policy in (plain, aware):
        _fill_hot(policy, impact=0.95)  # read often, but most of it recomputed at every read
        policy.touch("light")
    aware.note_impact("light", 0.0)  # read less often, reused whole
    assert plain.admit("light", 10, 1.0) == ["light"]  # TinyLFU: frequency alone, the newcomer loses
    evicted = aware.admit("light", 10, 1.0)
    assert aware.contains("light") and len(evicted) == 1 and evicted[0].startswith("hot")


def test_worth_falls_with_impact_down_to_the_floor() -> None:
    policy = ImpactTinyLFUPolicy(100, impact_weight=1.0, floor=0.2)
    assert policy.worth("unknown") == 1.0
    policy.note_impact("a", 0.25)
    assert policy.worth("a") == pytest.approx(0.75)
    policy.note_impact("a", 0.95)  # the running mean moved: the latest word counts
    assert policy.worth("a") == pytest.approx(0.2)
    for bad in (dict(impact_weight=-1.0), dict(floor=0.0)):
        with pytest.raises(ValueError):
            ImpactTinyLFUPolicy(100, **bad)
    with pytest.raises(ValueError):
        policy.note_impact("a", 1.5)


def test_registered_and_told_through_the_tenant_share_bound() -> None:
    policy = make_policy("impact_tinylfu", 1000, tenant_share=0.5)
    policy.admit("t/a", 10, 1.0)
    policy.note_impact("t/a", 0.5)  # forwarded to the wrapped policy
    inner = policy._inner
    assert isinstance(inner, ImpactTinyLFUPolicy) and inner.worth("t/a") == pytest.approx(0.55)


def test_the_tiered_store_hands_impacts_to_the_policies_that_weigh_them() -> None:
    specs = [TierSpec("ram", "ram://", 1 << 20, policy="impact_tinylfu"), TierSpec("ram2", "ram://", 1 << 20)]
    with TieredStore.from_specs(specs) as store:
        store.note_impact("some-key", 0.5)  # the second tier's plain TinyLFU ignores it
        policy = store._levels[0].policy
        assert isinstance(policy, ImpactTinyLFUPolicy) and policy.worth("some-key") == pytest.approx(0.55)
