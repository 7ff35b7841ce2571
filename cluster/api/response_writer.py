"""Writes a worker's events as an OpenAI-shaped response: whole (collect) or as server-sent events (sse)."""
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from cluster.api.request_models import ApiError
from cluster.api.response_models import (
    AssistantMessage,
    BlendStats,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkDelta,
    Completion,
    CompletionChoice,
    Usage,
)
from workers.worker import Event, Finished, TextDelta

DONE = b"data: [DONE]\n\n"
WORKER_FAILED_RETRY_AFTER_S = 2  # a dead replica leaves routing within a heartbeat timeout; most retries land well

_log = logging.getLogger(__name__)


def blend_stats(finished: Finished) -> BlendStats:
    """The `blend` object of a response."""
    return BlendStats(
        ttft_s=finished.ttft_s,
        mode=finished.mode,
        recompute_ratio=finished.recompute_ratio,
        reused_tokens=finished.reused_tokens,
        recomputed_tokens=finished.recomputed_tokens,
        worker=finished.worker,
        plan=finished.plan,
        predicted_ttft_s=finished.predicted_ttft_s,
        queued_s=round(finished.queued_s, 6),
        stages_s={stage: round(seconds, 6) for stage, seconds in finished.stages_s.items()},
        ingress_s=round(finished.ingress_s, 6),
    )


def usage(finished: Finished) -> Usage:
    """Token counts, with reused prompt tokens as OpenAI's cached tokens."""
    cached = sum(finished.reused_tokens.values())
    return Usage.of(finished.num_prompt_tokens, finished.num_completion_tokens, cached)


@dataclass(slots=True)
class ResponseFrame:
    """Identity shared by a response and all chunks of its stream."""

    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def complete(self, text: str, finished: Finished) -> ChatCompletion | Completion:
        """The whole response of a non-streaming request."""
        reason = finished.finish_reason
        common = {"id": self.id, "created": self.created, "model": self.model, "usage": usage(finished)}
        if self.chat:
            choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=reason)
            return ChatCompletion(**common, choices=[choice], blend=blend_stats(finished))
        return Completion(
            **common, choices=[CompletionChoice(text=text, finish_reason=reason)], blend=blend_stats(finished)
        )

    def chunk(self, text: str | None, finished: Finished | None = None) -> ChatCompletionChunk | Completion:
        """One stream chunk: a delta, or (with `finished`) the closing chunk carrying the blend stats."""
        reason = None if finished is None else finished.finish_reason
        blend = None if finished is None else blend_stats(finished)
        common = {"id": self.id, "created": self.created, "model": self.model, "blend": blend}
        if self.chat:
            choice = ChatChunkChoice(delta=ChunkDelta(content=text), finish_reason=reason)
            return ChatCompletionChunk(**common, choices=[choice])
        return Completion(**common, choices=[CompletionChoice(text=text or "", finish_reason=reason)])

    def usage_chunk(self, finished: Finished) -> ChatCompletionChunk | Completion:
        """The extra last chunk `stream_options.include_usage` asks for: no choices, usage and blend."""
        common = {"id": self.id, "created": self.created, "model": self.model}
        kind = ChatCompletionChunk if self.chat else Completion
        return kind(**common, choices=[], usage=usage(finished), blend=blend_stats(finished))


async def collect(events: AsyncIterator[Event]) -> tuple[str, Finished]:
    """The answer's text and the closing event."""
    parts = []
    async for event in events:
        if isinstance(event, TextDelta):
            parts.append(event.text)
        else:
            return "".join(parts), event
    raise RuntimeError("the worker's stream ended without its closing event")


async def sse(frame: ResponseFrame, events: AsyncIterator[Event], include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events: a role chunk (chat), the deltas, the closing chunk, usage if asked, [DONE]."""
    # The status line (200) is sent with the first event, so a later failure can only be told as an event:
    # an `error` object (which the openai client raises), then [DONE] so no client waits for more.
    try:
        if frame.chat:
            opening = ChatCompletionChunk(
                id=frame.id,
                created=frame.created,
                model=frame.model,
                choices=[ChatChunkChoice(delta=ChunkDelta(role="assistant", content=""))],
            )
            yield _event(opening)
        async for event in events:
            if isinstance(event, TextDelta):
                yield _event(frame.chunk(event.text))
                continue
            yield _event(frame.chunk(None if frame.chat else "", event))
            if include_usage:
                yield _event(frame.usage_chunk(event))
    except Exception as error:
        _log.warning("blendserve: stream %s failed after it started: %r", frame.id, error)
        yield b"data: " + json.dumps(stream_error(error).body()).encode() + b"\n\n"
    yield DONE


def stream_error(error: Exception) -> ApiError:
    """The error a failed request reports: its own if it is an API error, else the worker's failure (503)."""
    if isinstance(error, ApiError):
        return error
    message = f"the worker failed: {type(error).__name__}; retry the request"
    return ApiError(503, message, None, "worker_error", {"Retry-After": str(WORKER_FAILED_RETRY_AFTER_S)})


def _event(chunk: ChatCompletionChunk | Completion) -> bytes:
    return b"data: " + chunk.model_dump_json(exclude_none=True).encode() + b"\n\n"
