"""Property-based fuzzing of the request parser: any body gets a valid request or a clean 4xx, never a crash."""
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.api.request_models import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DocumentsRequest,
    parse_request,
)
from cluster.config import LimitsConfig, ServeConfig
from cluster.prompting import prepare_request

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMITS = LimitsConfig(max_request_body_bytes=65536)
KINDS = (ChatCompletionRequest, CompletionRequest, DocumentsRequest)
FIELDS = (
    "model", "messages", "prompt", "documents", "blend", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "stop", "stream", "stream_options", "seed", "n", "user", "presence_penalty", "frequency_penalty",
    "echo", "role", "content", "text", "id", "mode", "recompute_ratio", "include_usage",
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner,
                                                               max_size=6),
    max_leaves=25,
)
GOOD = {"messages": [{"role": "user", "content": "Where?"}], "documents": [{"text": "Paris."}], "max_tokens": 4}


def outcome(kind: type, body: bytes) -> Any:
    """The parsed request (prepared as the gateway does), or the ApiError; anything else fails the test."""
    try:
        request = parse_request(kind, body, LIMITS)
    except ApiError as error:
        assert 400 <= error.status_code < 500 and error.message and error.body()["error"]["message"] == error.message
        return error
    if kind is not DocumentsRequest:
        prepared = prepare_request(request, ServeConfig(limits=LIMITS))
        assert 1 <= prepared.blend.sampling.max_new_tokens <= LIMITS.max_tokens
        assert all(len(stop) <= LIMITS.max_stop_chars for stop in prepared.stop)
    return request


@FUZZ
@given(kind=st.sampled_from(KINDS), body=st.binary(max_size=2048))
def test_any_bytes_parse_or_get_a_4xx(kind: type, body: bytes) -> None:
    outcome(kind, body)


@FUZZ
@given(kind=st.sampled_from(KINDS), fields=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8))
def test_any_json_object_of_known_and_unknown_fields_parses_or_gets_a_4xx(kind: type, fields: dict) -> None:
    outcome(kind, json.dumps(fields).encode())


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=3))
def test_a_good_chat_request_with_any_field_changed_parses_or_gets_a_4xx(changes: dict) -> None:
    outcome(ChatCompletionRequest, json.dumps({**GOOD, **changes}).encode())


@FUZZ
@given(cut=st.integers(0, 200), insert=st.binary(min_size=1, max_size=8))
def test_a_good_body_cut_or_spliced_parses_or_gets_a_4xx(cut: int, insert: bytes) -> None:
    body = json.dumps(GOOD).encode()
    position = cut % (len(body) + 1)
    outcome(ChatCompletionRequest, body[:position] + insert + body[position:])
    outcome(ChatCompletionRequest, body[:position])


def test_the_good_body_is_accepted() -> None:
    assert isinstance(outcome(ChatCompletionRequest, json.dumps(GOOD).encode()), ChatCompletionRequest)
