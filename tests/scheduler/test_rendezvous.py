"""Rendezvous homes: independent of listing order, spread out, and only a removed worker's keys move."""
from collections import Counter

import pytest

from scheduler.rendezvous import home_worker

WORKERS = [f"worker-{i}" for i in range(5)]
KEYS = [f"chunk-{i:04d}" for i in range(2000)]


def test_home_ignores_listing_order() -> None:
    for key in KEYS[:100]:
        assert home_worker(key, WORKERS) == home_worker(key, reversed(WORKERS))


def test_keys_spread_over_workers() -> None:
    counts = Counter(home_worker(key, WORKERS) for key in KEYS)
    assert set(counts) == set(WORKERS)
    assert min(counts.values()) > 0.8 * len(KEYS) / len(WORKERS)


def test_removing_a_worker_moves_only_its_own_keys() -> None:
    removed = WORKERS[2]
    survivors = [worker for worker in WORKERS if worker != removed]
    for key in KEYS:
        before = home_worker(key, WORKERS)
        if before != removed:
            assert home_worker(key, survivors) == before


def test_no_workers_is_an_error() -> None:
    with pytest.raises(ValueError, match="workers"):
        home_worker("k", [])
