"""From a validated API request to the engine's BlendRequest, and the prompt checks that need token counts."""
from dataclasses import dataclass

from cluster.api.request_models import ApiError, ChatCompletionRequest, CompletionRequest
from cluster.config import ServeConfig
from workers.engines.base import BlendRequest, EngineLimits, RequestError, check_request
from workers.generation.conversation import Conversation, Turn
from workers.generation.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """What a worker runs for one API request, and what the ingress applies around it."""

    blend: BlendRequest
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def prepare_request(request: ChatCompletionRequest | CompletionRequest, config: ServeConfig) -> PreparedRequest:
    """Documents in order, the question, mode and recompute_ratio (request, else configured defaults) and sampling."""
    options = request.blend
    mode = options.mode if options is not None and options.mode is not None else config.fusion.mode
    recompute_ratio = options.recompute_ratio if options is not None else None
    max_tokens = request.requested_max_tokens
    sampling = SamplingParams(
        max_new_tokens=config.limits.default_max_tokens if max_tokens is None else max_tokens,
        # Greedy unless asked: answers over documents should not vary run to run (OpenAI's default is 1).
        temperature=0.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        seed=request.seed,
    )
    blend = BlendRequest(
        documents=[document.text for document in request.documents],
        question=request.question,
        mode=mode,
        recompute_ratio=config.fusion.recompute_ratio if recompute_ratio is None else recompute_ratio,
        sampling=sampling,
        conversation=conversation_of(request, config.prompt.documents_at),
    )
    return PreparedRequest(blend, request.stop, request.stream, request.include_usage)


def conversation_of(request: ChatCompletionRequest | CompletionRequest, documents_at: str) -> Conversation | None:
    """A chat's system prompt and earlier turns; None for a single question (and for text completions)."""
    if not isinstance(request, ChatCompletionRequest):
        return None
    conversation = Conversation(request.system, tuple(Turn(m.role, m.text) for m in request.turns), documents_at)
    return None if conversation.is_one_shot else conversation


def check_served(request: BlendRequest, num_prompt_tokens: int, limits: EngineLimits, prompt_field: str) -> None:
    """The engines' own check_request, as a 400 naming the request field (`prompt_field` for the prompt)."""
    try:
        check_request(request, num_prompt_tokens, limits)
    except RequestError as error:
        field = prompt_field if error.field == "prompt" else f"blend.{error.field}"
        code = "context_length_exceeded" if error.field == "prompt" else "invalid_value"
        raise ApiError(400, f"{field}: {error}", field, code) from None


def check_context_length(num_prompt_tokens: int, max_new_tokens: int, num_context_tokens: int, field: str) -> None:
    """Refuse (400) a prompt that, with the tokens to generate, does not fit the model's context."""
    if num_prompt_tokens + max_new_tokens > num_context_tokens:
        message = (
            f"{field}: the prompt of {num_prompt_tokens} tokens (with its documents) plus max_tokens "
            f"{max_new_tokens} exceeds the model's context of {num_context_tokens} tokens"
        )
        raise ApiError(400, message, field, "context_length_exceeded")


def truncate_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the earliest stop sequence (excluded), and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)
