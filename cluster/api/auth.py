"""Who may call the API: API keys from the configuration, an environment variable or a secret file, kept hashed."""
import hashlib
import hmac
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from cluster.api.request_models import ApiError
from cluster.config_schema import ServerConfig, check_api_keys

_BEARER = "bearer "


class AuthConfigError(ValueError):
    """The configured keys cannot be loaded, or the server would be open where it must not be."""


def load_api_keys(server: ServerConfig, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Every configured API key -> its tenant: inline keys, then the environment variable's, then the file's."""
    keys = dict(server.api_keys)
    if server.api_keys_env is not None:
        raw = environ.get(server.api_keys_env)
        if raw is None:
            raise AuthConfigError(f"server.api_keys_env: the environment variable {server.api_keys_env} is not set")
        keys.update(_parse_keys(raw, f"server.api_keys_env ({server.api_keys_env})"))
    if server.api_keys_file is not None:
        try:
            raw = Path(server.api_keys_file).read_text()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or type(error).__name__
            raise AuthConfigError(f"server.api_keys_file: cannot read {server.api_keys_file}: {reason}") from None
        keys.update(_parse_keys(raw, f"server.api_keys_file ({server.api_keys_file})"))
    return keys


def _parse_keys(raw: str, source: str) -> dict[str, str]:
    """A YAML (or JSON) mapping of API key to tenant; errors never quote the text, which holds secrets."""
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict) or not data:
        raise AuthConfigError(f"{source}: must hold a non-empty YAML or JSON mapping of API key to tenant")
    try:
        check_api_keys(data, source)
    except ValueError as error:
        raise AuthConfigError(str(error)) from None
    return {str(key): str(tenant) for key, tenant in data.items()}


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class KeyRing:
    """SHA-256 digests of the API keys; a presented key is hashed and compared with all of them in constant time."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self._entries = [(_digest(key), tenant) for key, tenant in keys.items()]

    def __bool__(self) -> bool:
        return bool(self._entries)

    def tenant_of(self, key: str) -> str | None:
        """The tenant of `key`, or None; every digest is compared, so the time does not tell which one matched."""
        digest = _digest(key)
        found = None
        for known, tenant in self._entries:
            if hmac.compare_digest(known, digest):
                found = tenant
        return found

    def caller(self, headers: Mapping[str, str]) -> str:
        """The tenant of the request's `Authorization: Bearer <key>`; 401 without a known key."""
        authorization = headers.get("authorization", "")
        if not authorization.lower().startswith(_BEARER):
            raise ApiError(401, "Authorization: a 'Bearer <API key>' header is required", None, "invalid_api_key")
        tenant = self.tenant_of(authorization[len(_BEARER) :].strip())
        if tenant is None:
            raise ApiError(401, "Authorization: unknown API key", None, "invalid_api_key")
        return tenant


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(server: ServerConfig, keys: KeyRing) -> None:
    """Refuse an open API (no keys) on an address other machines reach, unless `allow_unauthenticated` says so."""
    if not keys and not is_loopback(server.host) and not server.allow_unauthenticated:
        raise AuthConfigError(
            f"server.host: {server.host!r} is reachable from other machines and no API key is configured; set "
            "server.api_keys_env or server.api_keys_file, or server.allow_unauthenticated: true to serve it open"
        )


def check_json_content_type(headers: Mapping[str, str]) -> None:
    """415 unless the body is declared `application/json` (a web page cannot send that cross-site unasked)."""
    declared = headers.get("content-type")
    media_type = (declared or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        shown = "none" if declared is None else repr(declared[:80])
        message = f"Content-Type: must be application/json, got {shown}"
        raise ApiError(415, message, None, "unsupported_media_type")
