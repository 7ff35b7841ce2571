"""The ingress's edge on Starlette requests: the caller is checked before a byte of the body is read."""
import asyncio
import gc
import json

import pytest
from starlette.requests import Request

from cluster.api.auth import KeyRing
from cluster.api.edge import Edge
from cluster.api.request_models import ApiError
from cluster.config_schema import LimitsConfig, ServerConfig

KEY = "sk-acme-0001"
BODY = json.dumps({"messages": [{"role": "user", "content": "q"}]}).encode()


class Channel:
    """An ASGI receive channel that records whether the body was asked for."""

    def __init__(self, parts: list[bytes], delay_s: float = 0.0) -> None:
        self.parts = parts
        self.delay_s = delay_s
        self.reads = 0

    async def __call__(self) -> dict:
        self.reads += 1
        await asyncio.sleep(self.delay_s)
        part = self.parts.pop(0) if self.parts else b""
        return {"type": "http.request", "body": part, "more_body": bool(self.parts)}


def request(headers: dict[str, str], channel: Channel) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": raw}, channel)


def edge(keys: dict[str, str] | None = None, **server: object) -> Edge:
    config = ServerConfig(max_requests_in_flight_per_tenant=1, body_timeout_s=0.5, **server)
    return Edge(config, LimitsConfig(max_request_body_bytes=1000), KeyRing(keys or {}))


def enter(gate: Edge, headers: dict[str, str], channel: Channel) -> tuple[str, bytes]:
    return asyncio.run(gate.enter(request(headers, channel)))


def refusal(gate: Edge, headers: dict[str, str], channel: Channel) -> ApiError:
    with pytest.raises(ApiError) as caught:
        enter(gate, headers, channel)
    return caught.value


JSON = {"content-type": "application/json"}
AUTH = {"authorization": f"Bearer {KEY}", **JSON}


def test_a_known_key_and_a_json_body_pass_with_the_tenant() -> None:
    assert enter(edge({KEY: "acme"}), AUTH, Channel([BODY[:10], BODY[10:]])) == ("acme", BODY)


@pytest.mark.parametrize(
    ("headers", "status"),
    [(JSON, 401), ({"authorization": "Bearer sk-wrong-0001", **JSON}, 401),
     ({**AUTH, "x-tenant": "globex"}, 403), ({"authorization": f"Bearer {KEY}", "content-type": "text/plain"}, 415),
     ({**AUTH, "content-length": "5000"}, 413)],
)
def test_refusals_come_before_the_body_is_read(headers: dict[str, str], status: int) -> None:
    channel = Channel([b"{" * 5000])
    assert refusal(edge({KEY: "acme"}), headers, channel).status_code == status
    assert channel.reads == 0


def test_a_body_longer_than_declared_or_undeclared_is_cut_off_at_the_limit() -> None:
    channel = Channel([b" " * 600] * 100)
    error = refusal(edge(), JSON, channel)
    assert error.status_code == 413 and "exceed the limit of 1000 bytes" in error.message
    assert channel.reads == 2


def test_a_slow_body_times_out_with_408_and_frees_the_slot() -> None:
    gate = edge()
    error = refusal(gate, JSON, Channel([b"{", b"}"], delay_s=0.4))
    assert error.status_code == 408 and "not received within 0.5 s" in error.message
    assert gate.quota.in_flight("default") == 0


def test_the_quota_slot_is_held_until_the_stream_ends_or_is_dropped() -> None:
    gate = edge()
    tenant, _ = enter(gate, JSON, Channel([BODY]))
    assert refusal(gate, JSON, Channel([BODY])).status_code == 429

    async def events():
        yield b"data: 1\n\n"

    async def drain(stream) -> list[bytes]:
        return [chunk async for chunk in stream]

    assert asyncio.run(drain(gate.leave_after(events(), tenant))) == [b"data: 1\n\n"]
    assert gate.quota.in_flight(tenant) == 0
    enter(gate, JSON, Channel([BODY]))
    unstarted = gate.leave_after(events(), tenant)
    del unstarted  # a response cancelled before its first chunk
    gc.collect()
    assert gate.quota.in_flight(tenant) == 0


def test_models_and_metrics_need_a_key_when_keys_exist() -> None:
    gate = edge({KEY: "acme"})
    with pytest.raises(ApiError):
        gate.check_key({})
    with pytest.raises(ApiError):
        gate.check_key({}, metrics=True)
    gate.check_key({"authorization": f"Bearer {KEY}"})
    edge({KEY: "acme"}, metrics_require_key=False).check_key({}, metrics=True)
    edge().check_key({})


def test_a_draining_edge_refuses_new_requests_with_503_and_counts_those_in_flight() -> None:
    gate = edge()
    enter(gate, JSON, Channel([BODY]))
    gate.draining = True
    error = refusal(gate, JSON, Channel([BODY]))
    assert error.status_code == 503 and error.headers["Retry-After"] == "2" and "shutting down" in error.message
    assert gate.quota.total_in_flight() == 1
