"""HTTP API response models: OpenAI-compatible completions and chunks, with `usage` and the `blend` stats."""
from typing import Literal

from pydantic import BaseModel, ConfigDict


class BlendStats(BaseModel):
    """How a response was produced: the `blend` object of every response (more keys may be added)."""

    model_config = ConfigDict(extra="allow")

    ttft_s: float
    mode: str
    recompute_ratio: float
    reused_tokens: dict[str, int]
    recomputed_tokens: int
    worker: str
    plan: str = "blend"  # "blend" (fused from chunk KV) or "plain" (the whole prompt prefilled, exact)
    predicted_ttft_s: float | None = None  # the worker's prediction for the plan that ran (None: not planned)
    queued_s: float = 0.0  # of ttft_s, waiting for a slot on the worker
    stages_s: dict[str, float] = {}  # the rest of ttft_s, per stage of the worker's path (layout, lookup, ...)
    ingress_s: float = 0.0  # before ttft_s: the ingress's own time (membership, tokenizing, routing)


class PromptTokensDetails(BaseModel):
    """OpenAI's breakdown of prompt tokens: those served from cache."""

    cached_tokens: int = 0


class Usage(BaseModel):
    """Token counts of one response."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int = 0) -> "Usage":
        """Usage with the total filled in."""
        return cls(
            prompt_tokens=num_prompt_tokens,
            completion_tokens=num_completion_tokens,
            total_tokens=num_prompt_tokens + num_completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=num_cached_tokens),
        )


FinishReason = Literal["stop", "length"]


class _Choice(BaseModel):
    """The one choice of a response (n is always 1)."""

    index: int = 0
    finish_reason: FinishReason | None = None
    logprobs: None = None


class _Response(BaseModel):
    """Fields of every completion response and stream chunk; a stream's last chunk carries `usage` and `blend`."""

    id: str
    created: int
    model: str
    usage: Usage | None = None
    blend: BlendStats | None = None


class AssistantMessage(BaseModel):
    """The generated answer."""

    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Choice):
    """The choice of a chat completion."""

    message: AssistantMessage
    finish_reason: FinishReason


class ChatCompletion(_Response):
    """Response of `POST /v1/chat/completions`."""

    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    blend: BlendStats


class ChunkDelta(BaseModel):
    """What one stream chunk adds to the answer."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Choice):
    """The choice of a chat stream chunk."""

    delta: ChunkDelta


class ChatCompletionChunk(_Response):
    """One server-sent event of a chat stream."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class CompletionChoice(_Choice):
    """The choice of a text completion (or of one of its stream chunks)."""

    text: str


class Completion(_Response):
    """Response of `POST /v1/completions`, and each chunk of its stream."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class StoredDocument(BaseModel):
    """Where one uploaded document's KV now lives."""

    id: str | None
    key: str
    num_tokens: int
    tiers: list[str]
    computed: bool
    worker: str


class DocumentsResponse(BaseModel):
    """Response of `POST /v1/documents`, in request order."""

    object: Literal["list"] = "list"
    data: list[StoredDocument]


class DocumentInfo(BaseModel):
    """Response of `GET` and `DELETE /v1/documents/{id}`: an ingested document's metadata (not its text)."""

    id: str
    object: Literal["document"] = "document"
    key: str
    num_tokens: int
    num_bytes: int
    fingerprint: str
    file: str
    row: int
    deleted: bool = False


class ModelCard(BaseModel):
    """One served model."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "blendserve"


class ModelList(BaseModel):
    """Response of `GET /v1/models`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
