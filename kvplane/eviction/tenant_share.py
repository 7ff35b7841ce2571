"""A bound on one tenant's share of a tier while other tenants hold entries in it."""
from collections import OrderedDict
from typing import TYPE_CHECKING

from kvplane.keys import tenant_of_key

if TYPE_CHECKING:  # the registry in kvplane.eviction.policy wraps its policies in this one
    from kvplane.eviction.policy import EvictionPolicy


class TenantSharePolicy:
    """Wraps a policy: a tenant over `share` of the capacity makes room among its own entries, oldest first."""

    # A tenant alone may use the whole tier (nothing is evicted for fairness with nobody to be fair to).
    # Once other tenants hold entries, a tenant at its share displaces only its own entries, so no tenant
    # can flood the others out, whatever the inner policy would have admitted.

    def __init__(self, inner: "EvictionPolicy", capacity_bytes: int, share: float) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self._inner = inner
        self._limit_bytes = share * capacity_bytes
        self._sizes: dict[str, int] = {}
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}  # each tenant's keys, least recent first
        self._tenant_bytes: dict[str, int] = {}
        self._total_bytes = 0

    def admit(self, key: str, nbytes: int, priority: float) -> list[str]:
        """Make room among the tenant's own entries if it is over its share, then let the inner policy decide."""
        own: list[str] = []
        if not self._inner.contains(key):
            tenant = tenant_of_key(key)
            others_bytes = self._total_bytes - self._tenant_bytes.get(tenant, 0)
            while others_bytes > 0 and self._tenant_bytes.get(tenant, 0) + nbytes > self._limit_bytes:
                victim = next(iter(self._by_tenant[tenant]))
                self._inner.remove(victim)
                self._forget(victim)
                own.append(victim)
        victims = self._inner.admit(key, nbytes, priority)
        for victim in victims:
            self._forget(victim)
        if key not in victims:
            self._remember(key, nbytes)
        return own + victims

    def note_impact(self, key: str, impact: float) -> None:
        """Pass a chunk's context impact on to the inner policy."""
        self._inner.note_impact(key, impact)

    def touch(self, key: str) -> None:
        """Record a read."""
        self._inner.touch(key)
        tenant_keys = self._by_tenant.get(tenant_of_key(key))
        if tenant_keys is not None and key in tenant_keys:
            tenant_keys.move_to_end(key)

    def remove(self, key: str) -> None:
        """Forget `key`."""
        self._inner.remove(key)
        self._forget(key)

    def contains(self, key: str) -> bool:
        """Whether the inner policy holds `key`."""
        return self._inner.contains(key)

    def tenant_bytes(self, key_of_tenant: str) -> int:
        """Bytes held for the tenant of `key_of_tenant`."""
        return self._tenant_bytes.get(tenant_of_key(key_of_tenant), 0)

    def _remember(self, key: str, nbytes: int) -> None:
        if key in self._sizes:
            self._by_tenant[tenant_of_key(key)].move_to_end(key)
            return
        tenant = tenant_of_key(key)
        self._sizes[key] = nbytes
        self._by_tenant.setdefault(tenant, OrderedDict())[key] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + nbytes
        self._total_bytes += nbytes

    def _forget(self, key: str) -> None:
        nbytes = self._sizes.pop(key, None)
        if nbytes is None:
            return
        tenant = tenant_of_key(key)
        self._by_tenant[tenant].pop(key, None)
        self._tenant_bytes[tenant] -= nbytes
        self._total_bytes -= nbytes
        if not self._by_tenant[tenant]:
            del self._by_tenant[tenant], self._tenant_bytes[tenant]
