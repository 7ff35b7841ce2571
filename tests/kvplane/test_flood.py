"""Flood resistance: a hot set keeps its hit rate while one-off chunks ten times the capacity pass by."""
import pytest

from kvplane.codec import encode
from kvplane.store import TieredStore
from kvplane.tiers.memory import MemoryTier
from tests.kvplane.conftest import EntryFactory

CAPACITY_ENTRIES = 40
HOT_ENTRIES = 20
ROUNDS = 10


def hot_hit_rate_under_flood(make_entry: EntryFactory, policy: str) -> float:
    """Serve the hot set like a worker (get; on a miss, compute and put), then let one-offs flood in."""
    hot = [make_entry(seed, num_layers=1, num_tokens=4) for seed in range(HOT_ENTRIES)]
    entry_bytes = encode(hot[0]).numel()
    one_offs_per_round = CAPACITY_ENTRIES * 10 // ROUNDS
    hits = lookups = 0
    with TieredStore([MemoryTier("ram", CAPACITY_ENTRIES * entry_bytes)], policy) as store:
        for round_index in range(ROUNDS):
            for entry in hot:
                found = store.get(entry.key) is not None
                if not found:
                    store.put(entry)
                if round_index > 0:  # the first round only warms the cache
                    hits += found
                    lookups += 1
            for n in range(one_offs_per_round):
                store.put(make_entry(10_000 + round_index * one_offs_per_round + n, num_layers=1, num_tokens=4))
            store.flush()  # evictions finish in the background; let them land, as they do between requests
    return hits / lookups


def test_tinylfu_keeps_the_hot_set_through_a_flood(make_entry: EntryFactory) -> None:
    assert hot_hit_rate_under_flood(make_entry, "tinylfu") >= 0.9


def test_lru_loses_the_hot_set_to_the_same_flood(make_entry: EntryFactory) -> None:
    assert hot_hit_rate_under_flood(make_entry, "lru") <= 0.1


@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_without_a_flood_both_policies_hit(make_entry: EntryFactory, policy: str) -> None:
    hot = [make_entry(seed, num_layers=1, num_tokens=4) for seed in range(HOT_ENTRIES)]
    with TieredStore([MemoryTier("ram", CAPACITY_ENTRIES * encode(hot[0]).numel())], policy) as store:
        for entry in hot:
            store.put(entry)
        assert all(store.get(entry.key) is not None for entry in hot)
