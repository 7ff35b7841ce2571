"""A serving worker: runs jobs on its engine and reports text deltas, then one closing event with the stats."""
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from workers.engines.base import BlendRequest, Engine, StoredChunk
from workers.generation.text_stream import TextStream
from workers.guardrails.shadow import ShadowSampler
from workers.loading.request_plan import BLEND_PLAN


@dataclass(frozen=True, slots=True)
class Job:
    """One API request as the worker runs it."""

    request: BlendRequest
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New answer text."""

    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The job's last event: why it ended, token counts and how the prompt's KV was produced."""

    finish_reason: str
    num_prompt_tokens: int
    num_completion_tokens: int
    ttft_s: float  # from the job's arrival at the worker (its replica) to the first token
    mode: str
    recompute_ratio: float
    reused_tokens: dict[str, int] = field(default_factory=dict)
    recomputed_tokens: int = 0
    worker: str = ""
    plan: str = BLEND_PLAN
    predicted_ttft_s: float | None = None
    queued_s: float = 0.0  # of ttft_s, waiting for a slot on the worker before the engine took the job
    stages_s: dict[str, float] = field(default_factory=dict)  # the rest of ttft_s, per stage (engines.stages)
    ingress_s: float = 0.0  # before ttft_s, at the ingress: membership, tokenizing, routing (the gateway's stamp)


Event = TextDelta | Finished


class Worker:
    """One engine behind a worker id; runs up to `engine.max_concurrent_jobs` jobs at once (its shell's bound)."""

    def __init__(
        self, engine: Engine, worker_id: str, shadow: ShadowSampler | None = None, blending_refused: bool = False
    ) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.shadow = shadow
        self.blending_refused = blending_refused  # the canary gate failed at start: full prefill only

    def run(self, job: Job, received_s: float | None = None) -> Iterator[Event]:
        """Prefill, then stream the answer; a stop string ends decoding early.

        `received_s` (time.perf_counter) is when the job reached the worker, if it waited for a slot.
        """
        queued_s = 0.0 if received_s is None else max(time.perf_counter() - received_s, 0.0)
        generation = self.engine.open(job.request)
        if self.shadow is not None:
            self.shadow.observe(job.request, generation.stats)  # after the first token: off the hot path
        text = TextStream(self.engine.tokenizer, job.stop)
        num_tokens = 0
        stop_token_ids = set(job.request.sampling.stop_token_ids or self.engine.stop_token_ids)
        finish_reason = "length"
        tokens = iter(generation)
        try:
            for token_id in tokens:
                num_tokens += 1
                if token_id in stop_token_ids:
                    finish_reason = "stop"
                    break
                delta = text.push(token_id)
                if delta:
                    yield TextDelta(delta)
                if text.stopped:
                    finish_reason = "stop"
                    break
        finally:
            tokens.close()  # writes the missed chunks back
        if tail := text.finish():
            yield TextDelta(tail)
        stats = generation.stats
        yield Finished(
            finish_reason=finish_reason,
            num_prompt_tokens=stats.num_prompt_tokens,
            num_completion_tokens=num_tokens,
            ttft_s=queued_s + stats.ttft_s,
            mode=stats.mode,
            recompute_ratio=stats.recompute_ratio,
            reused_tokens=dict(stats.reused_tokens_by_tier),
            recomputed_tokens=stats.recomputed_tokens,
            worker=self.worker_id,
            plan=stats.plan,
            predicted_ttft_s=stats.predicted_ttft_s,
            queued_s=queued_s,
            stages_s=dict(stats.stages_s),
        )

    def store_documents(self, documents: list[str], namespace: str) -> list[StoredChunk]:
        """Compute and keep the documents' chunk KV ahead of requests."""
        return self.engine.store_documents(documents, namespace)
