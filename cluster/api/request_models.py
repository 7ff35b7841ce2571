"""HTTP API request models: OpenAI-compatible, extended with `documents` and `blend`; parsing and errors."""
import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cluster.config import LimitsConfig, field_problems
from workers.fusion.registry import FUSION_MODES

MAX_STOP_SEQUENCES = 4
MAX_TEMPERATURE = 2.0
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)  # OpenAI's int64 seeds; larger ones would overflow the samplers
_NOT_YET = "not supported yet (text chat only: no tools, images or audio)"
_INSTRUCTIONS = ("system", "developer")


class ApiError(Exception):
    """A refused request: HTTP status and an OpenAI-style error whose message leads with the field path."""

    def __init__(
        self,
        status_code: int,
        message: str,
        param: str | None = None,
        code: str = "invalid_value",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The error object the `openai` client parses."""
        kind = "invalid_request_error" if self.status_code < 500 else "server_error"
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return {"error": error}


def _limits(info: ValidationInfo) -> LimitsConfig:
    """The configured limits passed as validation context (the defaults when validated without one)."""
    context = info.context if isinstance(info.context, dict) else {}
    return context.get("limits") or LimitsConfig()


def _content_text(value: Any) -> Any:
    """OpenAI message content: a string, or a list of text parts joined by newlines."""
    if not isinstance(value, list):
        return value
    texts = []
    for index, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind != "text":
            raise ValueError(f"[{index}].type must be 'text': {kind!r} parts are not supported yet (text only)")
        if not (kind == "text" and isinstance(part.get("text"), str)):
            raise ValueError("must be a string or a list of {'type': 'text', 'text': str} parts (text only)")
        texts.append(part["text"])
    return "\n".join(texts)


def _unsupported(value: Any) -> Any:
    """A field of OpenAI's API that blendserve does not serve yet: absent, null or empty (`"tool_calls": []`)."""
    if value not in (None, [], {}):
        raise ValueError(f"is {_NOT_YET}")
    return None


def _stop_tuple(value: Any) -> Any:
    """`stop`: absent, one string, or a list of strings, as a tuple."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list):
        raise ValueError("must be a string or a list of strings")
    return tuple(value)


def _one_prompt(value: Any) -> Any:
    """`prompt`: a string, or a list holding one string."""
    if not isinstance(value, list):
        return value
    if len(value) != 1:
        raise ValueError(f"must be one prompt (a string or a list of one string), got {len(value)}")
    return value[0]


def _check_max_tokens(value: int | None, info: ValidationInfo) -> int | None:
    """A token budget within [1, limits.max_tokens]."""
    limit = _limits(info).max_tokens
    if value is not None and not 1 <= value <= limit:
        raise ValueError(f"must be in [1, {limit}], got {value}")
    return value


def _non_empty(text: str) -> str:
    """Text with at least one non-blank character."""
    if not text.strip():
        raise ValueError("must be a non-empty string")
    return text


class _Request(BaseModel):
    """Request bodies: unknown fields and type coercion are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Document(_Request):
    """One retrieved document; it becomes one chunk of the prompt, in list order."""

    id: str | None = None
    text: str | None = None  # None: the text of the document ingested under `id` (for the caller's tenant)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else _non_empty(value)

    @field_validator("text")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return None if value is None else _non_empty(value)

    @model_validator(mode="after")
    def _id_or_text(self) -> "Document":
        if self.id is None and self.text is None:
            raise ValueError("text must be given (or the id of an ingested document)")
        return self


class BlendOptions(_Request):
    """Per-request fusion choice; absent fields take the configured defaults."""

    mode: str | None = None
    recompute_ratio: float | None = None

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str | None) -> str | None:
        if value is not None and value not in FUSION_MODES:
            raise ValueError(f"must be one of {sorted(FUSION_MODES)}, got {value!r}")
        return value

    @field_validator("recompute_ratio")
    @classmethod
    def _ratio(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 <= value <= 1.0:
            raise ValueError(f"must be in [0, 1], got {value}")
        return value


class StreamOptions(_Request):
    """OpenAI `stream_options`: a final chunk with usage (and the blend stats) when `include_usage`."""

    include_usage: bool = False


class _GenerationRequest(_Request):
    """Fields shared by chat and text completions."""

    model: str | None = None
    documents: list[Document] = Field(default_factory=list)
    blend: BlendOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: Annotated[tuple[str, ...], BeforeValidator(_stop_tuple)] = ()
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int = 1
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @field_validator("documents")
    @classmethod
    def _documents(cls, value: list[Document], info: ValidationInfo) -> list[Document]:
        limit = _limits(info).max_documents
        if len(value) > limit:
            raise ValueError(f"must hold at most {limit} documents, got {len(value)}")
        return value

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, value: int | None, info: ValidationInfo) -> int | None:
        return _check_max_tokens(value, info)

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 <= value <= MAX_TEMPERATURE:
            raise ValueError(f"must be in [0, {MAX_TEMPERATURE:g}], got {value}")
        return value

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 < value <= 1.0:
            raise ValueError(f"must be in (0, 1], got {value}")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_sequences(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if len(value) > MAX_STOP_SEQUENCES or not all(value):
            shown = [s[:40] for s in value[: MAX_STOP_SEQUENCES + 1]]
            raise ValueError(f"must be at most {MAX_STOP_SEQUENCES} non-empty strings, got {shown}")
        # Every generated token is checked against every stop string: their length bounds that work.
        limit = _limits(info).max_stop_chars
        longest = max((len(s) for s in value), default=0)
        if longest > limit:
            raise ValueError(f"each stop string must be at most {limit} characters, got one of {longest}")
        return value

    @field_validator("seed")
    @classmethod
    def _seed(cls, value: int | None) -> int | None:
        low, high = SEED_RANGE
        if value is not None and not low <= value <= high:
            raise ValueError(f"must be a 64-bit integer in [{low}, {high}]")
        return value

    @field_validator("n")
    @classmethod
    def _n(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"must be 1 (one choice per request), got {value}")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value not in (None, 0.0):
            raise ValueError(f"must be 0 or absent (penalties are not supported), got {value}")
        return value

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self) -> "_GenerationRequest":
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options must be absent unless stream is true (as OpenAI's API requires)")
        return self

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a chunk carrying usage and blend stats."""
        return self.stream_options is not None and self.stream_options.include_usage


Unsupported = Annotated[Any, BeforeValidator(_unsupported)]


class ChatMessage(_Request):
    """One chat message; only text content is accepted (tool calls, images and audio are refused by name)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Annotated[str | None, BeforeValidator(_content_text)] = None
    name: str | None = None
    tool_calls: Unsupported = None
    tool_call_id: Unsupported = None
    function_call: Unsupported = None
    audio: Unsupported = None
    refusal: str | None = None

    @field_validator("role")
    @classmethod
    def _role(cls, value: str) -> str:
        if value in ("tool", "function"):
            raise ValueError(f"must be system, developer, user or assistant: {value!r} messages are {_NOT_YET}")
        return value

    @property
    def text(self) -> str:
        """The message's text ("" for none)."""
        return self.content or ""


class ChatCompletionRequest(_GenerationRequest):
    """`POST /v1/chat/completions`: system/developer messages, earlier turns, and last the user's question."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    tools: Unsupported = None
    tool_choice: Unsupported = None
    functions: Unsupported = None
    function_call: Unsupported = None
    audio: Unsupported = None
    modalities: Unsupported = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise ValueError("must hold at least one message (the question, from the user)")
        last = len(value) - 1
        if value[last].role != "user":
            role = value[last].role
            raise ValueError(f"[{last}].role must be 'user' (the last message is the question), got {role!r}")
        leading = next(i for i, message in enumerate(value) if message.role not in _INSTRUCTIONS)
        for index, message in enumerate(value[leading:], leading):
            if message.role in _INSTRUCTIONS:
                raise ValueError(
                    f"[{index}].role must be 'user' or 'assistant' after the conversation has begun: "
                    f"{message.role} messages come first, got one at position {index}"
                )
            if not message.text.strip():
                problem = "(the question)" if index == last else f"(an earlier {message.role} turn)"
                raise ValueError(f"[{index}].content must be a non-empty string {problem}")
        return value

    @field_validator("max_completion_tokens")
    @classmethod
    def _max_completion_tokens(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("max_tokens") not in (None, value):
            raise ValueError("must equal max_tokens when both are given")
        return _check_max_tokens(value, info)

    @property
    def question(self) -> str:
        """The last user message's text."""
        return self.messages[-1].text

    @property
    def system(self) -> str | None:
        """The leading system and developer messages' text, joined by blank lines; None when there are none."""
        texts = [m.text for m in self.messages[:-1] if m.role in _INSTRUCTIONS]
        return "\n\n".join(texts) if texts else None

    @property
    def turns(self) -> list[ChatMessage]:
        """The earlier user and assistant turns, oldest first (the question excluded)."""
        return [m for m in self.messages[:-1] if m.role not in _INSTRUCTIONS]

    @property
    def requested_max_tokens(self) -> int | None:
        """`max_tokens`, or its newer name `max_completion_tokens`."""
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens


class CompletionRequest(_GenerationRequest):
    """`POST /v1/completions`: `prompt` is the question over `documents`."""

    prompt: Annotated[str, BeforeValidator(_one_prompt)]
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        return _non_empty(value)

    @field_validator("echo")
    @classmethod
    def _echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("must be false (echo is not supported)")
        return value

    @property
    def question(self) -> str:
        """The prompt's text."""
        return self.prompt

    @property
    def requested_max_tokens(self) -> int | None:
        """`max_tokens` as sent."""
        return self.max_tokens


class DocumentsRequest(_Request):
    """`POST /v1/documents`: documents whose KV is computed and stored ahead of time (idempotent)."""

    model: str | None = None
    documents: list[Document]

    @field_validator("documents")
    @classmethod
    def _documents(cls, value: list[Document], info: ValidationInfo) -> list[Document]:
        limit = _limits(info).max_upload_documents
        if not 1 <= len(value) <= limit:
            raise ValueError(f"must hold 1 to {limit} documents, got {len(value)}")
        for index, document in enumerate(value):
            if document.text is None:
                raise ValueError(f"[{index}].text must be given to store a document (an id alone names a stored one)")
        return value


RequestT = TypeVar("RequestT", bound=_Request)


def api_error(error: ValidationError) -> ApiError:
    """A 400 whose message lists each problem as `field.path: problem`."""
    problems = [(path or "body", problem) for path, problem in field_problems(error)]
    return ApiError(400, "; ".join(f"{path}: {problem}" for path, problem in problems), problems[0][0])


class _DuplicateKey(ValueError):
    """A JSON object names the same key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object hook: a dict, unless a key repeats (which would silently keep the last value)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def _check_json_shape(body: bytes) -> None:
    """Refuse duplicate object keys and nesting too deep to parse; other JSON errors are pydantic's to name."""
    try:
        json.loads(body, object_pairs_hook=_unique_keys)
    except _DuplicateKey as error:
        raise ApiError(400, f"body: the key {str(error)[:80]!r} appears twice in one JSON object", None) from None
    except RecursionError:
        raise ApiError(400, "body: is not valid JSON (nested too deeply)", None) from None
    except ValueError:  # malformed JSON or bytes that are no text: pydantic's message names the problem
        pass


def parse_request(request_type: type[RequestT], body: bytes, limits: LimitsConfig) -> RequestT:
    """Validate a raw JSON body against `request_type` and the configured limits (size first: 413)."""
    if len(body) > limits.max_request_body_bytes:
        message = f"body: {len(body)} bytes exceed the limit of {limits.max_request_body_bytes} bytes"
        raise ApiError(413, message, None, "request_too_large")
    _check_json_shape(body)
    try:
        return request_type.model_validate_json(body, context={"limits": limits})
    except ValidationError as error:
        raise api_error(error) from None


def check_model(requested: str | None, served: str) -> None:
    """Refuse (404, like OpenAI) a model other than the one served; an absent model means the served one."""
    if requested is not None and requested != served:
        message = f"model: unknown model {requested!r}; this server serves {served!r}"
        raise ApiError(404, message, "model", "model_not_found")
