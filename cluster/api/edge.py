"""What the ingress checks before the gateway sees a request: the caller, the content type, the quota, the body."""
import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

from starlette.requests import ClientDisconnect, Request

from cluster.api.auth import KeyRing, check_json_content_type, load_api_keys
from cluster.api.request_models import ApiError
from cluster.api.tenancy import TenantQuota, tenant_of
from cluster.config import ServeConfig
from cluster.config_schema import LimitsConfig, ServerConfig

DRAINING_RETRY_AFTER_S = 2


class Edge:
    """Per ingress replica: authentication first, before a byte of the body is read, then the tenant's quota."""

    def __init__(self, server: ServerConfig, limits: LimitsConfig, keys: KeyRing) -> None:
        self._server = server
        self._limits = limits
        self._keys = keys
        self.quota = TenantQuota(server.max_requests_in_flight_per_tenant)
        self.draining = False  # set when the server is told to stop: new requests go elsewhere

    @classmethod
    def from_config(cls, config: ServeConfig) -> "Edge":
        """The edge of `config`, its keys loaded from wherever the configuration says they are."""
        return cls(config.server, config.limits, KeyRing(load_api_keys(config.server)))

    def check_key(self, headers: Mapping[str, str], metrics: bool = False) -> None:
        """For routes without a body or tenant (`/v1/models`, `/metrics` when configured): a known key if any exist."""
        if self._keys and (not metrics or self._server.metrics_require_key):
            self._keys.caller(headers)

    def tenant(self, headers: Mapping[str, str]) -> str:
        """The caller's tenant on a route without a body (a document by id); 401/403/400 as `enter` refuses."""
        if self.draining:
            message = "the server is shutting down; retry (another replica or instance takes the request)"
            raise ApiError(503, message, None, "service_unavailable", {"Retry-After": str(DRAINING_RETRY_AFTER_S)})
        return tenant_of(headers, self._server, self._keys)

    async def enter(self, request: Request) -> tuple[str, bytes]:
        """The caller's tenant and the body, holding a quota slot (`leave` frees it); 4xx before any body read."""
        if self.draining:
            message = "the server is shutting down; retry (another replica or instance takes the request)"
            raise ApiError(503, message, None, "service_unavailable", {"Retry-After": str(DRAINING_RETRY_AFTER_S)})
        tenant = tenant_of(request.headers, self._server, self._keys)
        check_json_content_type(request.headers)
        self.quota.acquire(tenant)
        try:
            body = await read_body(request, self._limits.max_request_body_bytes, self._server.body_timeout_s)
        except BaseException:
            self.quota.release(tenant)
            raise
        return tenant, body

    def leave(self, tenant: str) -> None:
        """Free the quota slot `enter` took."""
        self.quota.release(tenant)

    def leave_after(self, stream: AsyncIterator[bytes], tenant: str) -> AsyncIterator[bytes]:
        """`stream`, freeing the tenant's slot when it ends, fails, is cancelled or is dropped unstarted."""
        return _LeavingStream(stream, lambda: self.leave(tenant))


async def read_body(request: Request, limit_bytes: int, timeout_s: float) -> bytes:
    """The raw body: 413 past `limit_bytes` (declared or as it arrives), 408 when it takes over `timeout_s`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        message = f"body: {declared} bytes exceed the limit of {limit_bytes} bytes"
        raise ApiError(413, message, None, "request_too_large")
    try:
        return await asyncio.wait_for(_read_at_most(request, limit_bytes), timeout_s)
    except TimeoutError:
        raise ApiError(408, f"body: not received within {timeout_s:g} s", None, "request_timeout") from None
    except ClientDisconnect:
        raise ApiError(400, "body: the client went away before sending all of it", None) from None


async def _read_at_most(request: Request, limit_bytes: int) -> bytes:
    parts: list[bytes] = []
    num_bytes = 0
    async for part in request.stream():
        num_bytes += len(part)
        if num_bytes > limit_bytes:
            message = f"body: at least {num_bytes} bytes exceed the limit of {limit_bytes} bytes"
            raise ApiError(413, message, None, "request_too_large")
        parts.append(part)
    return b"".join(parts)


class _LeavingStream:
    """An async iterator that calls `leave` once when its source ends, fails, is closed or is garbage collected."""

    def __init__(self, source: AsyncIterator[bytes], leave: Callable[[], None]) -> None:
        self._source = source
        self._leave = leave
        self._left = False

    def __aiter__(self) -> "_LeavingStream":
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._source.__anext__()
        except BaseException:
            self._release()
            raise

    async def aclose(self) -> None:
        """Close the source and leave."""
        try:
            aclose = getattr(self._source, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self._release()

    def _release(self) -> None:
        if not self._left:
            self._left = True
            self._leave()

    def __del__(self) -> None:
        # A response cancelled before its first chunk never iterates this; the slot must still come back.
        self._release()
