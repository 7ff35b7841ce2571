"""What a worker serves through: the request and result types, the one request check, and the Engine interface."""
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

from kvplane.checks import check_count
from workers.chunks.store import DEFAULT_NAMESPACE
from workers.engines.stages import ENGINE_WAIT, LAYOUT, PLAN, StageClock
from workers.fusion.base import FusionMode
from workers.fusion.baselines.full_prefill import FullPrefill
from workers.generation.conversation import Conversation
from workers.generation.prompt import PromptLayout
from workers.generation.sampling import SamplingParams, until_stop
from workers.loading.planner import RequestPlanner
from workers.loading.request_plan import BLEND_PLAN, PLAIN_PLAN, RequestPlan
from workers.model.runner import ModelRunner

PLAIN_MODE = FullPrefill.name  # the whole prompt prefilled as is: no chunk KV read, exact by construction

PREFIX_CACHE_TIER = "prefix_cache"  # reused tokens found in the engine's own prefix cache (vLLM's)

@dataclass(frozen=True, slots=True)
class BlendRequest:
    """A question over documents (each document is one chunk, in prompt order), under a tenant's namespace."""

    documents: list[str]
    question: str
    mode: str = "cacheblend"
    recompute_ratio: float | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    namespace: str = DEFAULT_NAMESPACE
    prompt: PromptLayout | None = None  # laid out by the gateway (token ids, chunk boundaries): not tokenized again
    conversation: Conversation | None = None  # a chat's system prompt and earlier turns (None: one question)


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What an engine can take: its real context (prompt plus generated tokens) and its fusion modes."""

    max_context_tokens: int
    modes: frozenset[str]

    def __post_init__(self) -> None:
        check_count("max_context_tokens", self.max_context_tokens, 1)


class RequestError(ValueError):
    """A request an engine cannot serve as asked; `field` names what is wrong (mode, recompute_ratio, prompt)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


def check_request(request: BlendRequest, num_prompt_tokens: int, limits: EngineLimits) -> None:
    """Refuse what `limits` cannot serve; the gateway and both engines run this same check."""
    if request.mode not in limits.modes:
        raise RequestError("mode", f"unknown fusion mode {request.mode!r}; choose from {sorted(limits.modes)}")
    recompute_ratio = request.recompute_ratio
    if recompute_ratio is not None and not 0.0 <= recompute_ratio <= 1.0:
        raise RequestError("recompute_ratio", f"recompute_ratio must be in [0, 1], got {recompute_ratio}")
    needed = num_prompt_tokens + request.sampling.max_new_tokens
    if needed > limits.max_context_tokens:
        raise RequestError(
            "prompt",
            f"the prompt of {num_prompt_tokens} tokens (with its documents) plus max_tokens "
            f"{request.sampling.max_new_tokens} exceeds the model's context of {limits.max_context_tokens} tokens",
        )


class FusionCore(Protocol):
    """What an engine needs of the fusion core it composes (workers.fuser.Fuser) before it fuses."""

    runner: ModelRunner
    modes: Mapping[str, FusionMode]

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer."""

    def layout(self, documents: list[str], question: str) -> PromptLayout:
        """Token layout of a request under the template."""

    def ratio_for(self, recompute_ratio: float | None) -> float:
        """A request's ratio, or the configured default when it asks for none."""

    def missed_tokens(self, prompt: PromptLayout, namespace: str) -> int:
        """Tokens of the prompt's cached parts (prefix and chunks) that no tier holds now."""

    def precompute(self, prompt: PromptLayout, namespace: str) -> int:
        """Compute and store the KV of every part not yet cached; returns how many."""

    def store_next_turn(
        self, conversation: Conversation | None, question: str, answer_ids: list[int], prompt: PromptLayout,
        namespace: str,
    ) -> bool:
        """Store the KV of the prefix the conversation's next turn opens with, where it changes; whether computed."""


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A checked request laid out: its prompt, ratio, sampling (stop tokens filled in) and the plan it runs under."""

    prompt: PromptLayout
    recompute_ratio: float
    sampling: SamplingParams
    mode: str  # the fusion mode that runs: the request's, or PLAIN_MODE when the planner chose plain prefill
    plan: RequestPlan | None = None  # None: no planner priced it, the request runs as asked
    clock: StageClock = field(default_factory=StageClock)  # its stages so far, timed as it goes

    @property
    def warms_chunks(self) -> bool:
        """Whether to store the missed chunks after a plain answer: blending them would pay next time."""
        return self.plan is not None and self.plan.warm_chunks

    def stamp(self, stats: "PrefillStats") -> "PrefillStats":
        """The stats with the plan that ran, its predicted TTFT and where the TTFT went."""
        stats.plan = PLAIN_PLAN if self.mode == PLAIN_MODE else BLEND_PLAN
        stats.predicted_ttft_s = None if self.plan is None else self.plan.predicted_ttft_s
        stats.stages_s = self.clock.until_first_token(stats.ttft_s)
        return stats


@dataclass(slots=True)
class PrefillStats:
    """How the prompt's KV was produced, known once the first token's logits are."""

    mode: str
    recompute_ratio: float
    ttft_s: float
    num_prompt_tokens: int
    context_tokens: int
    reused_tokens_by_tier: dict[str, int]
    recomputed_tokens: int
    recomputed_fraction: float
    first_token_logprobs: torch.Tensor  # [V] float32
    plan: str = BLEND_PLAN  # "blend" (fused from chunk KV) or "plain" (the whole prompt prefilled)
    predicted_ttft_s: float | None = None  # the planner's prediction for the plan that ran (None: no planner)
    stages_s: dict[str, float] = field(default_factory=dict)  # seconds per stage of the TTFT (workers.engines.stages)

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens whose cached KV was reused, from any tier."""
        return sum(self.reused_tokens_by_tier.values())


def prefill_stats(
    *,
    mode: str,
    recompute_ratio: float,
    ttft_s: float,
    num_prompt_tokens: int,
    context_tokens: int,
    fused_tokens: int,
    fused_fraction: float,
    reused_tokens_by_tier: dict[str, int],
    first_token_logprobs: torch.Tensor,
) -> PrefillStats:
    """Stats when a fusion filled the first `fused_tokens` context tokens, recomputing `fused_fraction` of them."""
    computed_after = num_prompt_tokens - fused_tokens
    if 0 < context_tokens == fused_tokens:  # the whole context fused: its own fraction, exactly
        fraction = fused_fraction
    else:
        fraction = (fused_fraction * fused_tokens + context_tokens - fused_tokens) / max(context_tokens, 1)
    return PrefillStats(
        mode=mode,
        recompute_ratio=recompute_ratio,
        ttft_s=ttft_s,
        num_prompt_tokens=num_prompt_tokens,
        context_tokens=context_tokens,
        reused_tokens_by_tier=reused_tokens_by_tier,
        recomputed_tokens=round(fused_fraction * fused_tokens) + computed_after,
        recomputed_fraction=fraction,
        first_token_logprobs=first_token_logprobs,
    )


@dataclass(slots=True)
class BlendResult:
    """The answer and what it cost."""

    token_ids: list[int]
    text: str
    stats: PrefillStats


WriteBack = Callable[[list[int]], None]
"""What an engine stores once a request's answer ends, given the token ids it generated."""


class Generation:
    """A prefilled request: its stats now, its tokens as they are decoded; misses are written back at the end."""

    def __init__(self, stats: PrefillStats, tokens: Iterator[int], write_back: WriteBack) -> None:
        self.stats = stats
        self._tokens = tokens
        self._write_back = write_back

    def __iter__(self) -> Iterator[int]:
        generated: list[int] = []
        try:
            for token_id in self._tokens:
                generated.append(token_id)
                yield token_id
        finally:
            # Also when the consumer stops early (a stop string, a closed stream): the KV is already computed.
            self._write_back(generated)


@dataclass(slots=True)
class StoredChunk:
    """One document's chunk after `store_documents`: its key, size, whether it was computed now, where it is."""

    num_tokens: int
    computed: bool
    key: str = ""
    tiers: list[str] = field(default_factory=list)


class Engine(ABC):
    """Prefill a RAG request from cached chunk KV, decode it, and keep documents' KV ahead of time."""

    fuser: FusionCore  # the fusion core the engine composes
    stop_token_ids: tuple[int, ...]  # end-of-sequence ids used when a request names none
    max_concurrent_jobs: int = 1  # jobs its worker may run at once (an engine that batches says more)
    planner: RequestPlanner | None = None  # its curves measured at worker start; None: every request runs as asked

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The served model's tokenizer."""
        return self.fuser.tokenizer

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the engine computes and caches KV in (its fusion's and its decoder's)."""
        return self.fuser.runner.dtype

    @property
    @abstractmethod
    def limits(self) -> EngineLimits:
        """Its real context limit and the modes it serves (what check_request holds requests to)."""

    @abstractmethod
    def open(self, request: BlendRequest) -> Generation:
        """Prefill `request`; the generation yields token ids as they are decoded."""

    def prepare(self, request: BlendRequest) -> PreparedRequest:
        """Lay `request` out and check it against the limits; its ratio, and its stop tokens or the model's."""
        clock = StageClock()
        prompt = request.prompt
        if prompt is None:
            with clock.timed(LAYOUT):
                prompt = self.fuser.layout(request.documents, request.question, request.conversation)
        check_request(request, len(prompt.token_ids), self.limits)
        sampling = request.sampling
        if not sampling.stop_token_ids:
            sampling = replace(sampling, stop_token_ids=self.stop_token_ids)
        recompute_ratio = self.fuser.ratio_for(request.recompute_ratio)
        with clock.timed(PLAN):
            plan = self._plan(request, prompt, recompute_ratio)
        mode = PLAIN_MODE if plan is not None and plan.name == PLAIN_PLAN else request.mode
        return PreparedRequest(prompt, recompute_ratio, sampling, mode, plan, clock)

    def _plan(self, request: BlendRequest, prompt: PromptLayout, recompute_ratio: float) -> RequestPlan | None:
        """The planner's choice for a request in the mode and ratio it measured (others run as asked)."""
        if self.planner is None or not self.planner.prices(request.mode, recompute_ratio):
            return None
        return self.planner.plan(len(prompt.token_ids), self.fuser.missed_tokens(prompt, request.namespace))

    def planned_stats(self, prepared: PreparedRequest, stats: "PrefillStats") -> "PrefillStats":
        """The stats stamped with the plan that ran; its measured TTFT corrects that plan's curve."""
        # A prompt found in the prefix cache costs what neither curve prices: it says nothing about them.
        from_prefix_cache = PREFIX_CACHE_TIER in stats.reused_tokens_by_tier
        if prepared.plan is not None and self.planner is not None and not from_prefix_cache:
            # Waiting for other requests' work on the engine's thread is neither plan's cost (either would have
            # waited): counted, a queue under load would look like a slow plan and flip the choice.
            own_s = stats.ttft_s - prepared.clock.seconds.get(ENGINE_WAIT, 0.0)
            self.planner.observe(prepared.plan, own_s)
        return prepared.stamp(stats)

    def warm(self, prepared: PreparedRequest, namespace: str) -> None:
        """After a plain answer that missed chunks worth blending next time: store them (off the first token)."""
        if prepared.warms_chunks:
            self.fuser.precompute(prepared.prompt, namespace)

    def stores_next_turn(self, request: BlendRequest) -> bool:
        """Whether `request` opens its conversation's next turn: a conversation, in a mode that reads stored KV."""
        return request.conversation is not None and self.fuser.modes[request.mode].reads_chunk_cache

    def store_next_turn(self, request: BlendRequest, prepared: PreparedRequest, generated_ids: list[int]) -> None:
        """Between turns, for a mode that reads stored KV: the prefix its conversation's next turn opens with."""
        if not self.stores_next_turn(request):
            return
        answer_ids = until_stop(generated_ids, prepared.sampling.stop_token_ids)
        self.fuser.store_next_turn(request.conversation, request.question, answer_ids, prepared.prompt,
                                   request.namespace)

    def generate(self, request: BlendRequest) -> BlendResult:
        """Answer one request in full; misses are written back after the answer."""
        generation = self.open(request)
        token_ids = list(generation)
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True).strip()
        return BlendResult(token_ids, text, generation.stats)

    @abstractmethod
    def store_documents(self, documents: list[str], namespace: str) -> list[StoredChunk]:
        """Compute (if missing) and store each document's chunk KV, in order."""

    def close(self) -> None:
        """Release what the engine holds (threads, a vLLM engine); nothing by default."""
