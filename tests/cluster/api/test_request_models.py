"""HTTP API models: OpenAI client request shapes validate; bad input is refused naming the field; responses."""
import json
from typing import Any

import pytest
from pydantic import ValidationError

from cluster.api.request_models import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DocumentsRequest,
    check_model,
    parse_request,
)
from cluster.api.response_models import (
    BlendStats,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    DocumentsResponse,
    ModelList,
    Usage,
)
from cluster.config import LimitsConfig, ServeConfig, config_from_dict
from cluster.prompting import PreparedRequest, check_context_length, prepare_request, truncate_at_stop
from workers.generation.sampling import SamplingParams

LIMITS = LimitsConfig()
QUESTION = [{"role": "user", "content": "Who wrote Hamlet?"}]
DOCUMENTS = [{"id": "d1", "text": "Hamlet is a tragedy."}, {"text": "It was written by Shakespeare."}]
BLEND_STATS = {
    "ttft_s": 0.12,
    "mode": "cacheblend",
    "recompute_ratio": 0.15,
    "reused_tokens": {"ram": 40, "ssd": 10},
    "recomputed_tokens": 9,
    "worker": "worker-0",
    "plan": "blend",
    "predicted_ttft_s": 0.11,
    "queued_s": 0.0,
    "stages_s": {"lookup": 0.02, "fusion": 0.07, "first_token": 0.03},
    "ingress_s": 0.004,
}


def openai_body(**params: Any) -> bytes:
    """The body `openai` sends: given params only, `extra_body` merged at the top level, as JSON."""
    extra_body = params.pop("extra_body", {})
    return json.dumps({**params, **extra_body}).encode()


def prepared_chat(body: bytes, config: ServeConfig | None = None) -> PreparedRequest:
    """A chat body through validation and into the engine's terms."""
    return prepare_request(parse_request(ChatCompletionRequest, body, LIMITS), config or ServeConfig())


def refused(body: bytes | dict, kind: type = ChatCompletionRequest, limits: LimitsConfig = LIMITS) -> ApiError:
    """The ApiError a body is refused with."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ApiError) as caught:
        parse_request(kind, raw, limits)
    return caught.value


def test_openai_chat_request_with_extra_body_becomes_a_blend_request() -> None:
    body = openai_body(
        model="SmolLM2-135M-Instruct",
        messages=QUESTION,
        max_tokens=24,
        temperature=0.7,
        top_p=0.9,
        seed=7,
        stop=["\n"],
        extra_body={"documents": DOCUMENTS, "blend": {"mode": "epic", "recompute_ratio": 0.3}},
    )
    request = parse_request(ChatCompletionRequest, body, LIMITS)
    prepared = prepare_request(request, ServeConfig())
    assert prepared.blend.documents == ["Hamlet is a tragedy.", "It was written by Shakespeare."]
    assert prepared.blend.question == "Who wrote Hamlet?"
    assert (prepared.blend.mode, prepared.blend.recompute_ratio) == ("epic", 0.3)
    assert prepared.blend.sampling == SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, seed=7)
    assert prepared.stop == ("\n",) and not prepared.stream
    check_model(request.model, "SmolLM2-135M-Instruct")


def test_openai_streaming_chat_request_asks_for_the_final_usage_chunk() -> None:
    body = openai_body(
        model="m", messages=QUESTION, stream=True, stream_options={"include_usage": True},
        max_completion_tokens=12, extra_body={"documents": DOCUMENTS},
    )
    prepared = prepared_chat(body)
    assert prepared.stream and prepared.include_usage
    assert prepared.blend.sampling.max_new_tokens == 12


def test_openai_text_completion_request_uses_the_prompt_as_the_question() -> None:
    body = openai_body(model="m", prompt="Who wrote Hamlet?", max_tokens=8, extra_body={"documents": DOCUMENTS})
    prepared = prepare_request(parse_request(CompletionRequest, body, LIMITS), ServeConfig())
    assert prepared.blend.question == "Who wrote Hamlet?" and len(prepared.blend.documents) == 2
    listed = parse_request(CompletionRequest, openai_body(prompt=["Why?"]), LIMITS)
    assert listed.question == "Why?"


def test_omitted_options_take_the_configured_defaults() -> None:
    config = config_from_dict(
        {"fusion": {"mode": "cachecraft", "recompute_ratio": 0.25}, "limits": {"default_max_tokens": 5}}
    )
    prepared = prepared_chat(openai_body(messages=QUESTION), config)
    assert prepared.blend.documents == [] and prepared.stop == ()
    assert (prepared.blend.mode, prepared.blend.recompute_ratio) == ("cachecraft", 0.25)
    assert prepared.blend.sampling == SamplingParams(max_new_tokens=5, temperature=0.0, top_p=1.0)


def test_a_zero_ratio_is_kept_and_mode_alone_keeps_the_configured_ratio() -> None:
    zero = openai_body(messages=QUESTION, blend={"recompute_ratio": 0.0})
    assert prepared_chat(zero).blend.recompute_ratio == 0.0
    blend = prepared_chat(openai_body(messages=QUESTION, blend={"mode": "full_reuse"})).blend
    assert (blend.mode, blend.recompute_ratio) == ("full_reuse", 0.15)


def test_text_content_parts_are_joined_into_the_question() -> None:
    parts = [{"type": "text", "text": "Who wrote"}, {"type": "text", "text": "Hamlet?"}]
    request = parse_request(ChatCompletionRequest, openai_body(messages=[{"role": "user", "content": parts}]), LIMITS)
    assert request.question == "Who wrote\nHamlet?"


USER = {"messages": QUESTION}


def test_system_and_developer_messages_and_earlier_turns_make_the_conversation() -> None:
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "developer", "content": [{"type": "text", "text": "Cite nothing."}]},
        {"role": "user", "content": "Who wrote Hamlet?"},
        {"role": "assistant", "content": "Shakespeare.", "refusal": None, "tool_calls": []},  # as frameworks echo it
        {"role": "user", "content": "When?", "name": "ann"},
    ]
    conversation = prepared_chat(openai_body(messages=messages)).blend.conversation
    assert conversation is not None and conversation.system == "You answer briefly.\n\nCite nothing."
    turns = [(t.role, t.text) for t in conversation.turns]
    assert turns == [("user", "Who wrote Hamlet?"), ("assistant", "Shakespeare.")]
    assert prepared_chat(openai_body(messages=messages)).blend.question == "When?"
    assert conversation.documents_at == "last"
    placed = config_from_dict({"prompt": {"documents_at": "start"}})
    assert prepared_chat(openai_body(messages=messages), placed).blend.conversation.documents_at == "start"
    assert prepared_chat(openai_body(messages=QUESTION)).blend.conversation is None  # one question: as before


@pytest.mark.parametrize(
    ("body", "param", "expected"),
    [
        ({}, "messages", "messages: is required"),
        ({"messages": []}, "messages", "messages: must hold at least one message"),
        ({"messages": "hi"}, "messages", "messages: input should be a valid array"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "messages[0].role", "must be 'user'"),
        ({"messages": [*QUESTION, {"role": "assistant", "content": "b"}]}, "messages[1].role", "got 'assistant'"),
        ({"messages": [*QUESTION, {"role": "system", "content": "x"}, *QUESTION]}, "messages[1].role",
         "system messages come first"),
        ({"messages": [*QUESTION, {"role": "assistant", "content": " "}, *QUESTION]}, "messages[1].content",
         "an earlier assistant turn"),
        ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "c1"}, *QUESTION]}, "messages[0].role",
         "'tool' messages are not supported yet"),
        ({"messages": [*QUESTION, {"role": "assistant", "tool_calls": [{"id": "c1"}]}, *QUESTION]},
         "messages[1].tool_calls", "is not supported yet"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0].type", "'image_url' parts are not supported yet"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[0].content[0].type",
         "'input_audio' parts"),
        ({"messages": [{"role": "user", "content": " "}]}, "messages[0].content", "must be a non-empty string"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "must be a non-empty string"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "input should be"),
        ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content", "text only"),
        ({**USER, "documents": [{"text": ""}]}, "documents[0].text", "must be a non-empty string"),
        ({**USER, "documents": [{"text": "a"}, {"text": 42}]}, "documents[1].text", "input should be a valid string"),
        ({**USER, "documents": [{}]}, "documents[0].text", "must be given (or the id of an ingested document)"),
        ({**USER, "documents": ["plain"]}, "documents[0]", "input should be an object"),
        ({**USER, "documents": [{"text": "a", "title": "t"}]}, "documents[0].title", "is not a known field"),
        ({**USER, "documents": [{"text": "a"}] * 65}, "documents", "must hold at most 64 documents, got 65"),
        ({**USER, "max_tokens": 0}, "max_tokens", "must be in [1, 1024], got 0"),
        ({**USER, "max_tokens": 4096}, "max_tokens", "must be in [1, 1024], got 4096"),
        ({**USER, "max_tokens": "16"}, "max_tokens", "input should be a valid integer"),
        ({**USER, "max_completion_tokens": 2000}, "max_completion_tokens", "must be in [1, 1024]"),
        ({**USER, "max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens", "must equal max_tokens"),
        ({**USER, "blend": {"mode": "turbo"}}, "blend.mode",
         "must be one of ['cacheblend', 'cacheblend_boundary', 'cachecraft', 'epic'"),
        ({**USER, "blend": {"recompute_ratio": 1.5}}, "blend.recompute_ratio", "must be in [0, 1], got 1.5"),
        ({**USER, "blend": {"recompute_ratio": -0.1}}, "blend.recompute_ratio", "must be in [0, 1], got -0.1"),
        ({**USER, "blend": {"ratio": 0.2}}, "blend.ratio", "is not a known field"),
        ({**USER, "temperature": 2.5}, "temperature", "must be in [0, 2], got 2.5"),
        ({**USER, "top_p": 0}, "top_p", "must be in (0, 1]"),
        ({**USER, "n": 2}, "n", "must be 1"),
        ({**USER, "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 non-empty strings"),
        ({**USER, "stop": 7}, "stop", "must be a string or a list of strings"),
        ({**USER, "presence_penalty": 0.5}, "presence_penalty", "penalties are not supported"),
        ({**USER, "stream": "yes"}, "stream", "input should be a valid boolean"),
        ({**USER, "tools": [{"type": "function"}]}, "tools", "is not supported yet (text chat only"),
        ({**USER, "tool_choice": "auto"}, "tool_choice", "is not supported yet"),
        ({**USER, "document": [{"text": "typo"}]}, "document", "is not a known field"),
    ],
)
def test_bad_chat_input_is_refused_with_a_400_naming_the_field(body: dict[str, Any], param: str, expected: str) -> None:
    error = refused(body)
    assert error.status_code == 400 and error.param == param
    assert error.message.startswith(f"{param}: ") and expected in error.message
    assert error.body()["error"]["param"] == param and error.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "param", "expected"),
    [
        ({"documents": DOCUMENTS}, "prompt", "is required"),
        ({"prompt": ""}, "prompt", "must be a non-empty string"),
        ({"prompt": ["a", "b"]}, "prompt", "must be one prompt"),
        ({"prompt": [1, 2, 3]}, "prompt", "must be one prompt"),
        ({"prompt": "q", "echo": True}, "echo", "echo is not supported"),
        ({"prompt": "q", "max_tokens": -1}, "max_tokens", "must be in [1, 1024]"),
    ],
)
def test_bad_completion_input_is_refused_naming_the_field(body: dict[str, Any], param: str, expected: str) -> None:
    error = refused(body, CompletionRequest)
    assert error.status_code == 400 and error.param == param and expected in error.message


def test_several_problems_are_reported_together() -> None:
    error = refused({**USER, "n": 3, "blend": {"mode": "turbo", "recompute_ratio": 2}})
    for param in ("n: ", "blend.mode: ", "blend.recompute_ratio: "):
        assert param in error.message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b"{not json", "body: is not valid JSON"), (b"[1, 2]", "body: input should be an object"), (b"", "body: ")],
)
def test_malformed_json_is_a_400_about_the_body(raw: bytes, expected: str) -> None:
    error = refused(raw)
    assert error.status_code == 400 and error.message.startswith(expected)


def test_a_body_over_the_limit_is_a_413_before_parsing() -> None:
    limits = LimitsConfig(max_request_body_bytes=100)
    error = refused(b"{" + b" " * 200 + b"}", limits=limits)
    assert error.status_code == 413 and "exceed the limit of 100 bytes" in error.message


def test_limits_come_from_the_configuration() -> None:
    limits = LimitsConfig(max_documents=2, max_tokens=10, default_max_tokens=10)
    assert refused({**USER, "documents": [{"text": "a"}] * 3}, limits=limits).param == "documents"
    assert "must be in [1, 10]" in refused({**USER, "max_tokens": 11}, limits=limits).message
    two = parse_request(ChatCompletionRequest, openai_body(**USER, documents=[{"text": "a"}] * 2), limits)
    assert len(two.documents) == 2


def test_validation_without_context_still_applies_the_default_limits() -> None:
    with pytest.raises(ValidationError, match="at most 64 documents"):
        ChatCompletionRequest.model_validate({**USER, "documents": [{"text": "a"}] * 65})


def test_model_names_are_checked_against_the_served_model() -> None:
    check_model(None, "SmolLM2-135M-Instruct")
    check_model("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct")
    with pytest.raises(ApiError) as caught:
        check_model("gpt-4o", "SmolLM2-135M-Instruct")
    assert caught.value.status_code == 404 and caught.value.param == "model"
    assert caught.value.message.startswith("model: unknown model 'gpt-4o'")
    assert caught.value.body()["error"]["code"] == "model_not_found"


def test_documents_upload_request_is_bounded_and_validated() -> None:
    request = parse_request(DocumentsRequest, openai_body(documents=DOCUMENTS), LIMITS)
    assert [d.id for d in request.documents] == ["d1", None]
    assert refused({"documents": []}, DocumentsRequest).param == "documents"
    too_many = refused({"documents": [{"text": "a"}] * 257}, DocumentsRequest)
    assert too_many.message.startswith("documents: must hold 1 to 256")
    assert refused({"documents": [{"id": "", "text": "a"}]}, DocumentsRequest).param == "documents[0].id"


def test_chat_completion_response_carries_usage_and_exactly_the_blend_keys() -> None:
    response = ChatCompletion(
        id="chatcmpl-1",
        created=1,
        model="m",
        choices=[{"message": {"content": "Shakespeare"}, "finish_reason": "stop"}],
        usage=Usage.of(60, 3, num_cached_tokens=50),
        blend=BLEND_STATS,
    )
    data = response.model_dump()
    assert data["object"] == "chat.completion" and data["choices"][0]["message"]["role"] == "assistant"
    assert data["usage"] == {
        "prompt_tokens": 60,
        "completion_tokens": 3,
        "total_tokens": 63,
        "prompt_tokens_details": {"cached_tokens": 50},
    }
    assert data["blend"] == BLEND_STATS


def test_blend_stats_require_the_documented_keys_and_allow_more() -> None:
    more = BlendStats.model_validate({**BLEND_STATS, "bytes_loaded": {"ram": 4096}})
    assert more.model_dump()["bytes_loaded"] == {"ram": 4096}
    with pytest.raises(ValidationError, match="worker"):
        BlendStats.model_validate({k: v for k, v in BLEND_STATS.items() if k != "worker"})


def test_stream_chunks_carry_blend_only_at_the_end() -> None:
    delta = {"delta": {"role": "assistant", "content": "Sh"}}
    first = ChatCompletionChunk(id="c", created=1, model="m", choices=[delta])
    last = ChatCompletionChunk(id="c", created=1, model="m", choices=[], usage=Usage.of(60, 3), blend=BLEND_STATS)
    assert first.model_dump()["blend"] is None and first.object == "chat.completion.chunk"
    assert last.model_dump()["blend"] == BLEND_STATS
    choice = {"text": "Shakespeare", "finish_reason": "length"}
    text = Completion(id="c", created=1, model="m", choices=[choice], blend=BLEND_STATS)
    assert text.object == "text_completion" and text.model_dump()["choices"][0]["finish_reason"] == "length"


def test_models_and_documents_responses_have_the_list_shape() -> None:
    models = ModelList(data=[{"id": "SmolLM2-135M-Instruct", "created": 0}]).model_dump()
    card = {"id": "SmolLM2-135M-Instruct", "object": "model", "created": 0, "owned_by": "blendserve"}
    assert models == {"object": "list", "data": [card]}
    entry = {"id": "d1", "key": "k", "num_tokens": 7, "tiers": ["ram", "ssd"], "computed": True, "worker": "w1"}
    stored = DocumentsResponse(data=[entry])
    assert stored.model_dump()["data"][0]["tiers"] == ["ram", "ssd"]


def test_a_prompt_longer_than_the_context_is_refused_naming_the_field() -> None:
    check_context_length(8000, 192, 8192, "messages")
    with pytest.raises(ApiError) as caught:
        check_context_length(8100, 256, 8192, "messages")
    assert caught.value.status_code == 400 and caught.value.param == "messages"
    assert "8100 tokens" in caught.value.message and "context of 8192 tokens" in caught.value.message


@pytest.mark.parametrize(
    ("text", "stop", "expected"),
    [
        ("Shakespeare.\nNext", ("\n",), ("Shakespeare.", True)),
        ("a END b STOP", ("STOP", "END"), ("a ", True)),
        ("abc", ("x",), ("abc", False)),
        ("abc", (), ("abc", False)),
    ],
)
def test_text_is_cut_at_the_earliest_stop_sequence(text: str, stop: tuple[str, ...], expected: tuple) -> None:
    assert truncate_at_stop(text, stop) == expected


@pytest.mark.parametrize(
    ("body", "param", "expected"),
    [
        ({**USER, "stop": ["x" * 200_000] * 4}, "stop", "each stop string must be at most 256 characters"),
        ({**USER, "stop": "x" * 257}, "stop", "got one of 257"),
        ({**USER, "stream_options": {"include_usage": True}}, "stream_options", "must be absent unless stream"),
        ({**USER, "stream": False, "stream_options": {}}, "stream_options", "must be absent unless stream"),
        ({**USER, "seed": 1 << 63}, "seed", "must be a 64-bit integer"),
        ({**USER, "seed": -(1 << 63) - 1}, "seed", "must be a 64-bit integer"),
        ({**USER, "seed": 10**100}, "seed", ""),
    ],
)
def test_unbounded_or_inconsistent_options_are_refused(body: dict[str, Any], param: str, expected: str) -> None:
    error = refused(body)
    assert error.status_code == 400 and error.param == param and expected in error.message


def test_bounded_options_are_accepted() -> None:
    body = openai_body(**USER, stop=["x" * 256] * 4, seed=(1 << 63) - 1, stream=True, stream_options={})
    request = parse_request(ChatCompletionRequest, body, LIMITS)
    assert request.seed == (1 << 63) - 1 and len(request.stop) == 4
    assert parse_request(ChatCompletionRequest, openai_body(**USER, seed=-(1 << 63)), LIMITS).seed == -(1 << 63)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            b'{"messages": [{"role": "user", "content": "q"}], "max_tokens": 1, "max_tokens": 900}',
            "'max_tokens' appears twice",
        ),
        (b'{"messages": [{"role": "user", "content": "q", "content": "r"}]}', "'content' appears twice"),
        (b'{"messages": [], "documents": [{"text": "a", "text": "b"}]}', "'text' appears twice"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"messages": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", "body: "),
    ],
)
def test_duplicate_keys_and_deep_nesting_are_refused(raw: bytes, expected: str) -> None:
    error = refused(raw)
    assert error.status_code == 400 and error.message.startswith("body: ") and expected in error.message
