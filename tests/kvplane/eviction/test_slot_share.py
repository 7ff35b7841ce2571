"""One SSD budget per node, as plain bookkeeping: equal shares of the live slots, each kept within its own."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplane.eviction.lru import LRUPolicy
from kvplane.eviction.policy import make_policy
from kvplane.eviction.slot_share import SlotSharePolicy, slot_share_bytes
from kvplane.store import TieredStore
from kvplane.tiers.memory import MemoryTier
from tests.kvplane.conftest import build_entry


def test_each_live_slot_gets_an_equal_share_and_together_they_stay_within_the_budget() -> None:
    assert slot_share_bytes(100, 1) == 100
    assert slot_share_bytes(100, 3) == 33
    assert all(n * slot_share_bytes(1001, n) <= 1001 for n in range(1, 65))
    with pytest.raises(ValueError, match="num_live_slots"):
        slot_share_bytes(100, 0)
    with pytest.raises(ValueError, match="budget_bytes"):
        slot_share_bytes(-1, 1)


def test_a_slot_over_its_share_evicts_its_own_oldest_entries() -> None:
    policy = SlotSharePolicy(LRUPolicy(100), 30)
    assert [policy.admit(key, 10, 1.0) for key in "abc"] == [[], [], []]
    policy.touch("a")
    assert policy.admit("d", 10, 1.0) == ["b"]  # within the node's 100 bytes, but over this slot's 30
    assert policy.admit("e", 20, 1.0) == ["c", "a"]
    assert [policy.contains(key) for key in "abcde"] == [False, False, False, True, True]
    assert policy.used_bytes == 30


def test_an_entry_larger_than_the_share_is_refused_and_nothing_is_evicted_for_it() -> None:
    policy = SlotSharePolicy(LRUPolicy(100), 30)
    policy.admit("a", 10, 1.0)
    assert policy.admit("big", 31, 1.0) == ["big"]
    assert policy.contains("a") and not policy.contains("big") and policy.used_bytes == 10


def test_a_falling_share_evicts_the_oldest_at_once_and_a_rising_one_evicts_nothing() -> None:
    policy = SlotSharePolicy(LRUPolicy(100), 100)
    for key in "abcde":
        policy.admit(key, 20, 1.0)
    policy.touch("a")
    assert policy.set_limit(50) == ["b", "c", "d"]
    assert policy.used_bytes == 40 and policy.contains("a") and policy.contains("e")
    assert policy.set_limit(100) == [] and policy.limit_bytes == 100
    with pytest.raises(ValueError, match="limit_bytes"):
        policy.set_limit(-1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "touch", "remove", "limit"]), st.integers(0, 15),
                          st.integers(1, 40)), max_size=120))
def test_the_share_is_never_exceeded_whatever_the_inner_policy_does(ops: list[tuple[str, int, int]]) -> None:
    policy = SlotSharePolicy(make_policy("tinylfu", 200), 120)
    held: dict[str, int] = {}
    for op, index, size in ops:
        key = f"k{index}"
        if op == "admit":
            victims = policy.admit(key, size, 1.0)
            for victim in victims:
                held.pop(victim, None)
            if key not in victims:
                held.setdefault(key, size)
        elif op == "touch":
            policy.touch(key)
        elif op == "remove":
            policy.remove(key)
            held.pop(key, None)
        else:
            for victim in policy.set_limit(size * 4):
                held.pop(victim)
        assert policy.used_bytes == sum(held.values()) <= policy.limit_bytes
        assert all(policy.contains(k) for k in held)


def test_a_capped_tier_of_a_store_drops_its_oldest_entries_when_its_share_falls() -> None:
    entries = [build_entry(seed) for seed in range(6)]
    with TieredStore([MemoryTier("ssd", 1 << 20)], "lru", capped_tiers=("ssd",)) as store:
        for entry in entries:
            store.put(entry)
        size = next(nbytes for _, nbytes in store.scan())
        assert store.cap_tier("ssd", 2 * size) == 4
        store.flush()
        assert [store.contains(entry.key) for entry in entries] == [False] * 4 + [True] * 2
        with pytest.raises(ValueError, match="capped_tiers"):
            store.cap_tier("ram", 1)
    with pytest.raises(ValueError, match="capped_tiers"):
        TieredStore([MemoryTier("ssd", 1 << 20)], "lru", capped_tiers=("ram",))
