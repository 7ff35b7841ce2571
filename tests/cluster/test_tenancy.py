"""Tenant resolution: API key, X-Tenant header, default; each refusal names the header."""
import pytest

from cluster.api_models import ApiError
from cluster.config_schema import ServerConfig
from cluster.tenancy import tenant_of

OPEN = ServerConfig()
KEYED = ServerConfig(api_keys={"sk-acme-0001": "acme", "sk-globex-01": "globex"})


def test_without_keys_the_header_or_the_default_names_the_tenant():
    assert tenant_of({}, OPEN) == "default"
    assert tenant_of({"x-tenant": "acme", "authorization": "Bearer anything"}, OPEN) == "acme"


def test_with_keys_the_key_names_the_tenant():
    assert tenant_of({"authorization": "Bearer sk-acme-0001"}, KEYED) == "acme"
    assert tenant_of({"authorization": "bearer sk-globex-01", "x-tenant": "globex"}, KEYED) == "globex"


@pytest.mark.parametrize(
    ("headers", "server", "status", "words"),
    [
        ({"x-tenant": "a/b"}, OPEN, 400, "X-Tenant: must be"),
        ({"x-tenant": ""}, OPEN, 400, "X-Tenant: must be"),
        ({}, KEYED, 401, "Authorization: a 'Bearer"),
        ({"authorization": "Bearer sk-nobody-99"}, KEYED, 401, "unknown API key"),
        ({"authorization": "Bearer sk-acme-0001", "x-tenant": "globex"}, KEYED, 403, "another tenant"),
    ],
)
def test_refusals(headers, server, status, words):
    with pytest.raises(ApiError) as caught:
        tenant_of(headers, server)
    assert caught.value.status_code == status and words in caught.value.message
