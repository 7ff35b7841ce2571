"""Rendezvous hashing: stable homes, balanced load, minimal movement when a shard goes."""
from collections import Counter

from kvplane.keys import chunk_key
from kvplane.rendezvous import home_shard, shard_order

SHARDS = [f"kvshard-node{i}" for i in range(4)]
KEYS = [chunk_key("fp", "t", [i]) for i in range(2000)]


def test_home_is_the_head_of_the_order_and_ignores_listing_order() -> None:
    for key in KEYS[:50]:
        assert home_shard(key, SHARDS) == shard_order(key, SHARDS)[0] == home_shard(key, reversed(SHARDS))


def test_keys_spread_over_shards() -> None:
    load = Counter(home_shard(key, SHARDS) for key in KEYS)
    assert set(load) == set(SHARDS)
    assert min(load.values()) > 0.8 * len(KEYS) / len(SHARDS)


def test_losing_a_shard_moves_only_its_keys_to_their_next_choice() -> None:
    survivors = SHARDS[1:]
    for key in KEYS:
        before = home_shard(key, SHARDS)
        after = home_shard(key, survivors)
        if before != SHARDS[0]:
            assert after == before
        else:
            assert after == shard_order(key, SHARDS)[1]


def test_no_shards_no_home() -> None:
    assert home_shard(KEYS[0], []) is None
