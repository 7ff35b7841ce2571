"""Location index: who holds which keys in which tier, for the router."""
from kvplane.ray.location_index import Location, LocationIndex


def test_placements_and_removals_are_tracked_per_holder_and_tier() -> None:
    index = LocationIndex()
    index.apply("worker-1", [("a", "device", 100), ("b", "device", 50)])
    index.apply("kvshard-n1", [("a", "ram", 100), ("a", "ssd", 100)])
    assert sorted(index.lookup(["a"])["a"], key=lambda loc: loc.tier) == [
        Location("worker-1", "device", 100),
        Location("kvshard-n1", "ram", 100),
        Location("kvshard-n1", "ssd", 100),
    ]
    index.apply("kvshard-n1", [("a", "ram", 0)])
    assert index.lookup(["a", "zzz"]) == {
        "a": [Location("worker-1", "device", 100), Location("kvshard-n1", "ssd", 100)],
        "zzz": [],
    }


def test_cached_bytes_sums_a_request_per_holder_and_tier() -> None:
    index = LocationIndex()
    index.apply("worker-1", [("a", "device", 100), ("b", "device", 50), ("c", "device", 7)])
    index.apply("kvshard-n1", [("b", "ram", 50)])
    assert index.cached_bytes(["a", "b", "missing"]) == {
        "worker-1": {"device": 150},
        "kvshard-n1": {"ram": 50},
    }


def test_a_dead_holder_is_dropped_whole() -> None:
    index = LocationIndex()
    index.apply("kvshard-n1", [("a", "ram", 1), ("b", "ssd", 2)])
    index.apply("worker-1", [("a", "device", 1)])
    assert index.drop_holder("kvshard-n1") == 2
    assert index.lookup(["a", "b"]) == {"a": [Location("worker-1", "device", 1)], "b": []}
    assert index.holders() == ["worker-1"]
