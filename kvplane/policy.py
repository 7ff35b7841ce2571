"""Eviction policy interface and the registry a store picks from once, at construction."""
from collections.abc import Callable
from typing import Protocol

from kvplane.lru import LRUPolicy
from kvplane.passthrough import PassthroughPolicy
from kvplane.tinylfu import TinyLFUPolicy


class EvictionPolicy(Protocol):
    """Decides what one tier keeps; pure bookkeeping, no I/O."""

    def admit(self, key: str, nbytes: int, priority: float) -> list[str]:
        """Record a write; return the keys to evict (the key itself if it is not admitted)."""

    def touch(self, key: str) -> None:
        """Record a read of `key`, hit or miss."""

    def remove(self, key: str) -> None:
        """Forget `key`."""

    def contains(self, key: str) -> bool:
        """Whether `key` is resident as far as the policy knows."""


POLICIES: dict[str, Callable[[int], EvictionPolicy]] = {
    "lru": LRUPolicy,
    "tinylfu": TinyLFUPolicy,
    "passthrough": PassthroughPolicy,
}


def make_policy(name: str, capacity_bytes: int) -> EvictionPolicy:
    """The policy registered under `name`, sized for `capacity_bytes`."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    return POLICIES[name](capacity_bytes)
