"""Eviction policies as pure bookkeeping: LRU order, TinyLFU admission, priority, the sketch."""
import pytest

from kvplane.eviction.lru import LRUPolicy
from kvplane.eviction.policy import make_policy
from kvplane.eviction.sketch import FrequencySketch
from kvplane.eviction.tinylfu import TinyLFUPolicy


def test_lru_evicts_least_recently_used_first() -> None:
    policy = LRUPolicy(capacity_bytes=30)
    for key in "abc":
        assert policy.admit(key, 10, 1.0) == []
    policy.touch("a")
    assert policy.admit("d", 10, 1.0) == ["b"]
    assert policy.admit("e", 20, 1.0) == ["c", "a"]
    assert [policy.contains(key) for key in "abcde"] == [False, False, False, True, True]


def test_lru_rejects_what_can_never_fit_without_evicting() -> None:
    policy = LRUPolicy(capacity_bytes=30)
    policy.admit("a", 10, 1.0)
    assert policy.admit("huge", 31, 1.0) == ["huge"]
    assert policy.contains("a")


def test_tinylfu_admits_freely_until_full() -> None:
    policy = TinyLFUPolicy(capacity_bytes=100, window_fraction=0.1)
    assert all(policy.admit(f"k{i}", 10, 1.0) == [] for i in range(10))
    assert all(policy.contains(f"k{i}") for i in range(10))


def test_tinylfu_keeps_frequent_keys_against_newcomers() -> None:
    policy = TinyLFUPolicy(capacity_bytes=100, window_fraction=0.1)
    for i in range(10):
        policy.admit(f"hot{i}", 10, 1.0)
    for _ in range(3):
        for i in range(10):
            policy.touch(f"hot{i}")
    for i in range(200):
        policy.admit(f"once{i}", 10, 1.0)
    # the window holds the newest one-off; main still holds every hot key it had room for
    assert sum(policy.contains(f"hot{i}") for i in range(10)) >= 9
    assert sum(policy.contains(f"once{i}") for i in range(200)) <= 1


def test_tinylfu_admits_a_newcomer_that_became_frequent() -> None:
    policy = TinyLFUPolicy(capacity_bytes=100, window_fraction=0.1)
    for i in range(10):
        policy.admit(f"old{i}", 10, 1.0)
    for _ in range(4):
        policy.touch("rising")
    evicted = policy.admit("rising", 10, 1.0)
    assert policy.contains("rising")
    assert len(evicted) == 1 and evicted[0].startswith("old")


def test_priority_scales_the_admission_score() -> None:
    policy = TinyLFUPolicy(capacity_bytes=100, window_fraction=0.0)
    for i in range(10):
        policy.admit(f"low{i}", 10, 0.1)
        policy.touch(f"low{i}")
    assert policy.admit("valued", 10, 10.0) != ["valued"]
    assert policy.contains("valued")
    assert policy.admit("worthless", 10, 0.0) == ["worthless"]


def test_removed_keys_free_their_bytes() -> None:
    policy = TinyLFUPolicy(capacity_bytes=20, window_fraction=0.0)
    policy.admit("a", 10, 1.0)
    policy.admit("b", 10, 1.0)
    policy.remove("a")
    assert policy.admit("c", 10, 1.0) == []
    assert not policy.contains("a")


def test_sketch_counts_and_ages() -> None:
    sketch = FrequencySketch(num_counters=64, sample_factor=10)
    for _ in range(5):
        sketch.add("x")
    sketch.add("y")
    assert sketch.estimate("x") >= 5 and sketch.estimate("y") >= 1
    assert sketch.estimate("never") <= 1
    for i in range(640):
        sketch.add(f"noise{i}")
    assert sketch.estimate("x") < 5


def test_policy_registry_rejects_unknown_names() -> None:
    assert isinstance(make_policy("lru", 10), LRUPolicy)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("fifo", 10)
