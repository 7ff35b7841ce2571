"""Which tenant a request belongs to: its API key's, else its X-Tenant header's, else the default."""
from collections.abc import Mapping

from cluster.api_models import ApiError
from cluster.config_schema import TENANT_RULE, ServerConfig, is_tenant_name

_BEARER = "bearer "


def tenant_of(headers: Mapping[str, str], server: ServerConfig) -> str:
    """The tenant whose chunk keys this request uses; 401/403/400 when the headers do not allow one."""
    asked = headers.get("x-tenant")
    if server.api_keys:
        authorization = headers.get("authorization", "")
        if not authorization.lower().startswith(_BEARER):
            raise ApiError(401, "Authorization: a 'Bearer <API key>' header is required", None, "invalid_api_key")
        tenant = server.api_keys.get(authorization[len(_BEARER) :].strip())
        if tenant is None:
            raise ApiError(401, "Authorization: unknown API key", None, "invalid_api_key")
        if asked is not None and asked != tenant:
            raise ApiError(403, f"X-Tenant: this API key belongs to another tenant than {asked!r}", None, "forbidden")
        return tenant
    if asked is None:
        return server.default_tenant
    if not is_tenant_name(asked):
        raise ApiError(400, f"X-Tenant: must be {TENANT_RULE}, got {asked!r}", None, "invalid_tenant")
    return asked
