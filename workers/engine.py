"""The reference torch engine: lay out a RAG request, fuse cached chunk KV with the chosen mode, decode."""
import time
from dataclasses import dataclass, field, replace

import torch

from workers.checkpoint import Checkpoint
from workers.chunk_kv import ChunkKV, compute_chunk_kv
from workers.chunk_store import ChunkStore, LocalChunkStore
from workers.decode import iter_decode
from workers.fusion.base import FusionOptions
from workers.fusion.layout import PREFIX, SUFFIX, BlendLayout
from workers.fusion.registry import make_fusion_modes
from workers.fusion.selective_pass import PrefillResult
from workers.kv_cache import KVCache
from workers.prompt import PromptLayout, PromptTemplate
from workers.runner import ModelRunner
from workers.sampling import SamplingParams

CHUNK_CONTEXTS = ("alone", "prefix")


@dataclass(frozen=True, slots=True)
class BlendRequest:
    """A question over documents (each document is one chunk, in prompt order)."""

    documents: list[str]
    question: str
    mode: str = "cacheblend"
    recompute_ratio: float | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(slots=True)
class BlendResult:
    """The answer and what it cost."""

    token_ids: list[int]
    text: str
    mode: str
    recompute_ratio: float
    ttft_s: float
    context_tokens: int
    reused_tokens: int
    recomputed_fraction: float
    first_token_logprobs: torch.Tensor  # [V] float32


class BlendEngine:
    """One model, one chunk store, every fusion mode; `generate` serves one request at a time."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        options: FusionOptions = FusionOptions(),
        store: ChunkStore | None = None,
        template: PromptTemplate | None = None,
        chunk_context: str = "prefix",
    ) -> None:
        if chunk_context not in CHUNK_CONTEXTS:
            raise ValueError(f"chunk_context must be one of {CHUNK_CONTEXTS}, got {chunk_context!r}")
        self.runner = ModelRunner(checkpoint)
        self.options = options
        self.modes = make_fusion_modes(options)
        self.store = store if store is not None else LocalChunkStore()
        self.template = template or PromptTemplate(checkpoint.tokenizer)
        self.chunk_context = chunk_context
        self.stop_token_ids = tuple(checkpoint.config.eos_token_ids) or (checkpoint.tokenizer.eos_token_id,)

    def layout(self, documents: list[str], question: str) -> PromptLayout:
        """Token layout of a request under the engine's template."""
        return self.template.layout(documents, question)

    def precompute(self, prompt: PromptLayout) -> int:
        """Compute and store the KV of every chunk (and the prefix) not yet cached; returns how many."""
        parts = [(prompt.prefix_ids, True)] + [(ids, False) for ids in prompt.chunk_ids]
        missing = [(ids, is_prefix) for ids, is_prefix in parts if ids and self._lookup(ids, is_prefix, prompt) is None]
        for ids, is_prefix in missing:
            self._store(ids, is_prefix, prompt)
        return len(missing)

    def generate(self, request: BlendRequest) -> BlendResult:
        """Answer one request; misses are computed in context now and written back after the answer."""
        mode = self.modes.get(request.mode)
        if mode is None:
            raise ValueError(f"unknown fusion mode {request.mode!r}; choose from {sorted(self.modes)}")
        ratio = self.options.recompute_ratio if request.recompute_ratio is None else request.recompute_ratio
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"recompute_ratio must be in [0, 1], got {ratio}")
        sampling = request.sampling
        if not sampling.stop_token_ids:
            sampling = replace(sampling, stop_token_ids=self.stop_token_ids)
        start_s = time.perf_counter()
        prompt = self.layout(request.documents, request.question)
        cache, prefill, layout = self.fuse(prompt, request.mode, ratio, sampling.max_new_tokens)
        first_logits = self.runner.logits(prefill.last_hidden[None])[0]
        ttft_s = time.perf_counter() - start_s
        token_ids = list(iter_decode(self.runner, cache, first_logits, sampling))
        if mode.reads_chunk_cache:
            for seg in layout.segments:
                if seg.cached is None and seg.kind != SUFFIX:
                    self._store(layout.token_ids[seg.start : seg.end].tolist(), seg.kind == PREFIX, prompt)
        reused = sum(s.num_tokens for s in layout.segments if s.cached is not None)
        return BlendResult(
            token_ids=token_ids,
            text=self.runner.checkpoint.tokenizer.decode(token_ids, skip_special_tokens=True).strip(),
            mode=request.mode,
            recompute_ratio=ratio,
            ttft_s=ttft_s,
            context_tokens=layout.num_context_tokens,
            reused_tokens=reused,
            recomputed_fraction=prefill.recomputed_fraction,
            first_token_logprobs=first_logits.log_softmax(-1),
        )

    def fuse(
        self, prompt: PromptLayout, mode_name: str, ratio: float, extra_capacity: int = 0
    ) -> tuple[KVCache, PrefillResult, BlendLayout]:
        """Fill a KV cache for the whole prompt with one fusion mode (no decoding)."""
        mode = self.modes[mode_name]
        layout = self._blend_layout(prompt, mode.reads_chunk_cache)
        limit = self.runner.config.max_position_embeddings
        if layout.num_tokens + extra_capacity > limit:
            raise ValueError(
                f"prompt of {layout.num_tokens} tokens plus max_tokens {extra_capacity} exceeds the "
                f"model's context of {limit} tokens"
            )
        cache = self.runner.new_cache(layout.num_tokens + extra_capacity)
        return cache, mode.prefill(self.runner, layout, cache, ratio), layout

    def _blend_layout(self, prompt: PromptLayout, reads_cache: bool) -> BlendLayout:
        if not reads_cache:
            return BlendLayout.build(prompt, [None] * len(prompt.chunk_ids), None)
        cached = [self._lookup(ids, False, prompt) for ids in prompt.chunk_ids]
        prefix = self._lookup(prompt.prefix_ids, True, prompt) if prompt.prefix_ids else None
        return BlendLayout.build(prompt, cached, prefix)

    def _context_ids(self, is_prefix: bool, prompt: PromptLayout) -> list[int]:
        """What a chunk's KV is computed after: nothing, or the prompt prefix (never for the prefix itself)."""
        return prompt.prefix_ids if self.chunk_context == "prefix" and not is_prefix else []

    def _lookup(self, ids: list[int], is_prefix: bool, prompt: PromptLayout) -> ChunkKV | None:
        return self.store.get(ids, self._context_ids(is_prefix, prompt))

    def _store(self, ids: list[int], is_prefix: bool, prompt: PromptLayout) -> None:
        context = self._context_ids(is_prefix, prompt)
        self.store.put(compute_chunk_kv(self.runner, ids, context), context)
