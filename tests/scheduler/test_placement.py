"""Worker reach from holders: own copies, same-node shards, other nodes' shards as remote."""
from scheduler.placement import worker_locations
from scheduler.weights import RouterWeights

WORKERS = {"w1": "node-a", "w2": "node-b"}
SHARDS = {"kvshard-node-a": "node-a", "kvshard-node-b": "node-b"}


def test_own_copy_beats_a_shard_and_other_nodes_see_remote():
    copies = {"k1": [("kvshard-node-a", "ssd"), ("w1", "device")], "k2": [("kvshard-node-b", "ram")]}
    locations = worker_locations(copies, WORKERS, SHARDS, RouterWeights())
    assert locations["k1"] == {"w1": "device", "w2": "remote"}
    assert locations["k2"] == {"w1": "remote", "w2": "ram"}


def test_unknown_holders_and_dead_workers_are_ignored():
    copies = {"k1": [("w9", "device"), ("kvshard-node-z", "ram")], "k2": []}
    assert worker_locations(copies, WORKERS, SHARDS, RouterWeights()) == {}


def test_the_best_weighted_tier_wins_per_worker():
    copies = {"k": [("kvshard-node-a", "ssd"), ("kvshard-node-b", "ram")]}
    weights = RouterWeights(tier_weights={"device": 1.0, "ram": 0.8, "ssd": 0.5, "remote": 0.6, "object": 0.1})
    assert worker_locations(copies, WORKERS, SHARDS, weights)["k"] == {"w1": "remote", "w2": "ram"}
