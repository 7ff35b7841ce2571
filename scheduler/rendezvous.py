"""The live worker a cold chunk key calls home: kvplane's rendezvous hashing over worker ids."""
from collections.abc import Iterable

from kvplane.rendezvous import home_shard


def home_worker(key: str, workers: Iterable[str]) -> str:
    """The worker `key` hashes to; removing a worker moves only the keys that were its own."""
    home = home_shard(key, workers)
    if home is None:
        raise ValueError("workers must name at least one live worker, got none")
    return home
