"""Which tenant a request belongs to (its API key's, else a trusted X-Tenant, else the default) and its quota."""
from collections import defaultdict
from collections.abc import Mapping

from cluster.api.auth import KeyRing
from cluster.api.request_models import ApiError
from cluster.config_schema import TENANT_RULE, ServerConfig, is_tenant_name

TENANT_QUOTA_RETRY_AFTER_S = 1


def tenant_of(headers: Mapping[str, str], server: ServerConfig, keys: KeyRing) -> str:
    """The tenant whose chunk keys this request uses; 401/403/400 when the headers do not allow one."""
    asked = headers.get("x-tenant")
    if keys:
        tenant = keys.caller(headers)
        if asked is not None and asked != tenant:
            message = f"X-Tenant: this API key belongs to another tenant than {asked[:80]!r}"
            raise ApiError(403, message, None, "forbidden")
        return tenant
    if asked is None:
        return server.default_tenant
    if not server.trust_tenant_header:
        message = (
            "X-Tenant: this server names no tenant from a header (it has no API keys and "
            "server.trust_tenant_header is off); send the request without it"
        )
        raise ApiError(403, message, None, "forbidden")
    if not is_tenant_name(asked):
        raise ApiError(400, f"X-Tenant: must be {TENANT_RULE}, got {asked[:80]!r}", None, "invalid_tenant")
    return asked


class TenantQuota:
    """Requests in flight per tenant, bounded: past the bound a tenant gets 429 while others are still served."""

    def __init__(self, max_in_flight: int) -> None:
        self._max_in_flight = max_in_flight
        self._in_flight: dict[str, int] = defaultdict(int)

    def acquire(self, tenant: str) -> None:
        """Count one more request of `tenant`, or refuse it (429 + Retry-After) at the bound."""
        if self._in_flight[tenant] >= self._max_in_flight:
            message = (
                f"tenant {tenant!r} already has {self._max_in_flight} requests in flight "
                f"(server.max_requests_in_flight_per_tenant); retry when one has finished"
            )
            headers = {"Retry-After": str(TENANT_QUOTA_RETRY_AFTER_S)}
            raise ApiError(429, message, None, "rate_limit_exceeded", headers)
        self._in_flight[tenant] += 1

    def release(self, tenant: str) -> None:
        """One request of `tenant` finished (however it ended)."""
        self._in_flight[tenant] -= 1
        if self._in_flight[tenant] <= 0:
            del self._in_flight[tenant]

    def in_flight(self, tenant: str) -> int:
        """Requests of `tenant` now in flight."""
        return self._in_flight.get(tenant, 0)

    def total_in_flight(self) -> int:
        """Requests of every tenant now in flight."""
        return sum(self._in_flight.values())
