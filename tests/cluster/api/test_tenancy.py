"""Tenant resolution (API key, trusted X-Tenant header, default) and the per-tenant quota of requests in flight."""
import pytest

from cluster.api.auth import KeyRing
from cluster.api.request_models import ApiError
from cluster.api.tenancy import TenantQuota, tenant_of
from cluster.config_schema import ServerConfig

OPEN = ServerConfig()
TRUSTING = ServerConfig(trust_tenant_header=True)
NO_KEYS = KeyRing({})
KEYED = ServerConfig()
KEYS = KeyRing({"sk-acme-0001": "acme", "sk-globex-01": "globex"})


def test_without_keys_a_trusted_header_or_the_default_names_the_tenant():
    assert tenant_of({}, OPEN, NO_KEYS) == "default"
    assert tenant_of({"x-tenant": "acme", "authorization": "Bearer anything"}, TRUSTING, NO_KEYS) == "acme"


def test_with_keys_the_key_names_the_tenant():
    assert tenant_of({"authorization": "Bearer sk-acme-0001"}, KEYED, KEYS) == "acme"
    assert tenant_of({"authorization": "bearer sk-globex-01", "x-tenant": "globex"}, KEYED, KEYS) == "globex"


@pytest.mark.parametrize(
    ("headers", "server", "keys", "status", "words"),
    [
        ({"x-tenant": "acme"}, OPEN, NO_KEYS, 403, "X-Tenant: this server names no tenant from a header"),
        ({"x-tenant": "a/b"}, TRUSTING, NO_KEYS, 400, "X-Tenant: must be"),
        ({"x-tenant": ""}, TRUSTING, NO_KEYS, 400, "X-Tenant: must be"),
        ({"x-tenant": "x" * 65}, TRUSTING, NO_KEYS, 400, "X-Tenant: must be"),
        ({}, KEYED, KEYS, 401, "Authorization: a 'Bearer"),
        ({"authorization": "Bearer sk-nobody-99"}, KEYED, KEYS, 401, "unknown API key"),
        ({"authorization": "Bearer sk-acme-0001", "x-tenant": "globex"}, KEYED, KEYS, 403, "another tenant"),
    ],
)
def test_refusals(headers, server, keys, status, words):
    with pytest.raises(ApiError) as caught:
        tenant_of(headers, server, keys)
    assert caught.value.status_code == status and words in caught.value.message


def test_a_tenant_at_its_quota_gets_429_while_others_are_served():
    quota = TenantQuota(max_in_flight=2)
    quota.acquire("acme")
    quota.acquire("acme")
    with pytest.raises(ApiError) as caught:
        quota.acquire("acme")
    assert caught.value.status_code == 429 and caught.value.headers["Retry-After"] == "1"
    assert "'acme' already has 2 requests in flight" in caught.value.message
    quota.acquire("globex")
    quota.release("acme")
    quota.acquire("acme")
    assert quota.in_flight("acme") == 2 and quota.in_flight("globex") == 1
