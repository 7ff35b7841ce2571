"""Rendezvous (highest-random-weight) hashing: a key's home among the live shards."""
from collections.abc import Iterable

import xxhash


def _weight(shard: str, key: str) -> int:
    return xxhash.xxh3_64_intdigest(f"{shard}\0{key}".encode())


def shard_order(key: str, shards: Iterable[str]) -> list[str]:
    """Shards from most to least preferred for `key`; losing one moves only the keys it was home to."""
    return sorted(shards, key=lambda shard: _weight(shard, key), reverse=True)


def home_shard(key: str, shards: Iterable[str]) -> str | None:
    """The most preferred shard for `key`, or None when there are none."""
    return max(shards, key=lambda shard: _weight(shard, key), default=None)
