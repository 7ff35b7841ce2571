"""Rendezvous (highest-random-weight) hashing: the live worker a cold chunk key calls home."""
from collections.abc import Iterable

import xxhash


def home_worker(key: str, workers: Iterable[str]) -> str:
    """The worker `key` hashes to; removing a worker moves only the keys that were its own."""
    home = max(workers, key=lambda worker: xxhash.xxh3_64_intdigest(f"{worker}\0{key}".encode()), default=None)
    if home is None:
        raise ValueError("workers must name at least one live worker, got none")
    return home
