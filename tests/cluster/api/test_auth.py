"""API keys: where they come from, how they are compared, and when an open API is refused."""
import json
from pathlib import Path

import pytest

from cluster.api.auth import (
    AuthConfigError,
    KeyRing,
    check_exposure,
    check_json_content_type,
    is_loopback,
    load_api_keys,
)
from cluster.api.request_models import ApiError
from cluster.config_schema import ServerConfig

ACME, GLOBEX = "sk-acme-0001", "sk-globex-01"


def test_keys_come_from_the_config_an_environment_variable_and_a_secret_file(tmp_path: Path) -> None:
    secret = tmp_path / "keys.yaml"
    secret.write_text(f"{GLOBEX}: globex\n")
    server = ServerConfig(api_keys={"sk-inline-01": "inline"}, api_keys_env="BLENDSERVE_KEYS",
                          api_keys_file=str(secret))
    keys = load_api_keys(server, {"BLENDSERVE_KEYS": json.dumps({ACME: "acme"})})
    assert keys == {"sk-inline-01": "inline", ACME: "acme", GLOBEX: "globex"}


@pytest.mark.parametrize(
    ("environ", "file_text", "words"),
    [
        ({}, None, "the environment variable BLENDSERVE_KEYS is not set"),
        ({"BLENDSERVE_KEYS": "not: [a mapping"}, None, "must hold a non-empty YAML or JSON mapping"),
        ({"BLENDSERVE_KEYS": "[]"}, None, "must hold a non-empty YAML or JSON mapping"),
        ({"BLENDSERVE_KEYS": '{"short": "acme"}'}, None, "keys of at least 8 characters"),
        ({"BLENDSERVE_KEYS": '{"sk-acme-0001": "no/slash"}'}, None, "1 to 64 letters"),
    ],
)
def test_bad_key_sources_are_refused_without_echoing_the_secret(environ, file_text, words) -> None:
    with pytest.raises(AuthConfigError) as caught:
        load_api_keys(ServerConfig(api_keys_env="BLENDSERVE_KEYS"), environ)
    assert words in str(caught.value)
    assert "sk-acme-0001" not in str(caught.value) and "short" not in str(caught.value)


def test_an_unreadable_secret_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AuthConfigError, match="cannot read .*missing.yaml"):
        load_api_keys(ServerConfig(api_keys_file=str(tmp_path / "missing.yaml")), {})


def test_keys_are_kept_as_digests_and_every_digest_is_compared() -> None:
    ring = KeyRing({ACME: "acme", GLOBEX: "globex"})
    assert ring.tenant_of(ACME) == "acme" and ring.tenant_of(GLOBEX) == "globex"
    assert ring.tenant_of("sk-acme-0002") is None and ring.tenant_of("") is None
    assert not KeyRing({})


@pytest.mark.parametrize(
    ("headers", "words"),
    [({}, "a 'Bearer <API key>' header is required"), ({"authorization": "Basic eDp5"}, "is required"),
     ({"authorization": "Bearer nope-nope-nope"}, "unknown API key"), ({"authorization": "Bearer "}, "unknown")],
)
def test_callers_without_a_known_bearer_key_get_401(headers, words) -> None:
    with pytest.raises(ApiError) as caught:
        KeyRing({ACME: "acme"}).caller(headers)
    assert caught.value.status_code == 401 and words in caught.value.message


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("::", False), ("10.0.0.5", False), ("example.com", False)],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_an_open_api_on_a_reachable_address_is_refused_unless_told() -> None:
    check_exposure(ServerConfig(), KeyRing({}))  # make serve: keyless on 127.0.0.1
    check_exposure(ServerConfig(host="0.0.0.0"), KeyRing({ACME: "acme"}))
    check_exposure(ServerConfig(host="0.0.0.0", allow_unauthenticated=True), KeyRing({}))
    with pytest.raises(AuthConfigError, match="'0.0.0.0' is reachable from other machines and no API key"):
        check_exposure(ServerConfig(host="0.0.0.0"), KeyRing({}))


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_json_bodies_are_accepted(content_type: str) -> None:
    check_json_content_type({"content-type": content_type})


@pytest.mark.parametrize(
    "headers", [{}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"},
                {"content-type": "multipart/form-data; boundary=x"}, {"content-type": "application/jsonx"}],
)
def test_other_content_types_get_415(headers: dict[str, str]) -> None:
    with pytest.raises(ApiError) as caught:
        check_json_content_type(headers)
    assert caught.value.status_code == 415 and caught.value.message.startswith("Content-Type: must be application/json")
