"""Eviction policy interface and the registry a store picks from once, at construction."""
from collections.abc import Callable
from typing import Protocol

from kvplane.eviction.impact_lfu import ImpactTinyLFUPolicy
from kvplane.eviction.lru import LRUPolicy
from kvplane.eviction.passthrough import PassthroughPolicy
from kvplane.eviction.tenant_share import TenantSharePolicy
from kvplane.eviction.tinylfu import TinyLFUPolicy


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

    def note_impact(self, key: str, impact: float) -> None:
        """A chunk's mean context impact so far (a policy that does not weigh impact ignores it)."""


POLICIES: dict[str, Callable[[int], EvictionPolicy]] = {
    "lru": LRUPolicy,
    "tinylfu": TinyLFUPolicy,
    "impact_tinylfu": ImpactTinyLFUPolicy,
    "passthrough": PassthroughPolicy,
}


def make_policy(name: str, capacity_bytes: int, tenant_share: float = 1.0) -> EvictionPolicy:
    """The policy registered under `name`, sized for `capacity_bytes`; below 1, `tenant_share` bounds each tenant."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    policy = POLICIES[name](capacity_bytes)
    if tenant_share >= 1.0 or name == "passthrough":  # a passthrough tier keeps its own books
        return policy
    return TenantSharePolicy(policy, capacity_bytes, tenant_share)
