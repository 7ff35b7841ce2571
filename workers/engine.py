"""The reference torch engine: lay out a RAG request, fuse cached chunk KV with the chosen mode, decode."""
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch
from transformers import PreTrainedTokenizerBase

from workers.checkpoint import Checkpoint
from kvplane.layer_stream import ChunkLost
from workers.chunk_kv import compute_chunk_kv
from workers.chunk_lookup import LookupResult, lookup_layout
from workers.chunk_store import DEFAULT_NAMESPACE, ChunkStore, LocalChunkStore
from workers.controller import LoadingController
from workers.decode import iter_decode
from workers.engine_base import Engine, StoredChunk
from workers.fusion.base import FusionOptions
from workers.fusion.full_prefill import FullPrefill
from workers.fusion.layer_feed import LayerLoader, PipelinedLoader, ignore_fetch
from workers.fusion.layout import PREFIX, SUFFIX, BlendLayout
from workers.fusion.registry import make_fusion_modes
from workers.fusion.selective_pass import PrefillResult
from workers.kv_cache import KVCache
from workers.prompt import PromptLayout, PromptTemplate
from workers.runner import ModelRunner
from workers.sampling import SamplingParams

CHUNK_CONTEXTS = ("alone", "prefix")

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BlendRequest:
    """A question over documents (each document is one chunk, in prompt order), under a tenant's namespace."""

    documents: list[str]
    question: str
    mode: str = "cacheblend"
    recompute_ratio: float | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    namespace: str = DEFAULT_NAMESPACE


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

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens whose cached KV was reused, from any tier."""
        return sum(self.reused_tokens_by_tier.values())


@dataclass(slots=True)
class BlendResult:
    """The answer and what it cost."""

    token_ids: list[int]
    text: str
    stats: PrefillStats


class Generation:
    """A prefilled request: its stats now, its tokens as they are decoded; misses are written back at the end."""

    def __init__(self, stats: PrefillStats, tokens: Iterator[int], write_back: Callable[[], None]) -> None:
        self.stats = stats
        self._tokens = tokens
        self._write_back = write_back

    def __iter__(self) -> Iterator[int]:
        try:
            yield from self._tokens
        finally:
            # Also when the consumer stops early (a stop string, a closed stream): the KV is already computed.
            self._write_back()


class BlendEngine(Engine):
    """One model, one chunk store, every fusion mode; serves one request at a time.

    `loader` decides how cached KV arrives (pipelined with recompute by default; EagerLoader loads it all
    first). With a `controller` (settable later, e.g. once calibrated), each request's ratio and per-chunk
    tier or recompute follow its plan.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        options: FusionOptions = FusionOptions(),
        store: ChunkStore | None = None,
        template: PromptTemplate | None = None,
        chunk_context: str = "prefix",
        loader: LayerLoader | None = None,
        controller: LoadingController | None = None,
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
        self.loader = loader if loader is not None else PipelinedLoader()
        self.controller = controller
        self.blending_refused: str | None = None

    def refuse_blending(self, reason: str) -> None:
        """Serve every request with full prefill from now on (the canary gate failed); stats name the mode used."""
        full = FullPrefill(self.options)
        self.modes = {name: mode if not mode.reads_chunk_cache else full for name, mode in self.modes.items()}
        self.blending_refused = reason

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The served model's tokenizer."""
        return self.runner.checkpoint.tokenizer

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the engine computes and caches KV in."""
        return self.runner.dtype

    @property
    def max_context_tokens(self) -> int:
        """Prompt plus generated tokens the model can attend over."""
        return self.runner.config.max_position_embeddings

    def layout(self, documents: list[str], question: str) -> PromptLayout:
        """Token layout of a request under the engine's template."""
        return self.template.layout(documents, question)

    def precompute(self, prompt: PromptLayout, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Compute and store the KV of every chunk (and the prefix) not yet cached; returns how many."""
        parts = [(prompt.prefix_ids, True)] + [(ids, False) for ids in prompt.chunk_ids]
        missing = [
            (ids, is_prefix) for ids, is_prefix in parts if ids and not self._tiers(ids, is_prefix, prompt, namespace)
        ]
        for ids, is_prefix in missing:
            self._store(ids, is_prefix, prompt, namespace)
        return len(missing)

    def store_documents(self, documents: list[str], namespace: str = DEFAULT_NAMESPACE) -> list[StoredChunk]:
        """Compute (if missing) and store each document's chunk KV; where each now lives, in order."""
        prompt = self.layout(documents, "")
        stored = []
        for ids in prompt.chunk_ids:
            computed = not self._tiers(ids, False, prompt, namespace)
            if computed:
                self._store(ids, False, prompt, namespace)
            stored.append(StoredChunk(len(ids), computed))
        if prompt.prefix_ids and not self._tiers(prompt.prefix_ids, True, prompt, namespace):
            self._store(prompt.prefix_ids, True, prompt, namespace)
        self.store.flush()
        for chunk, ids in zip(stored, prompt.chunk_ids):
            chunk.key = self.store.key(ids, self._context_ids(False, prompt), namespace)
            chunk.tiers = self._tiers(ids, False, prompt, namespace)
        return stored

    def open(self, request: BlendRequest) -> Generation:
        """Prefill one request with its fusion mode; the returned generation decodes on iteration."""
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
        cache, prefill, lookup = self._fuse(prompt, request.mode, ratio, sampling.max_new_tokens, request.namespace)
        layout = lookup.layout
        first_logits = self.runner.logits(prefill.last_hidden[None])[0]
        stats = PrefillStats(
            mode=mode.name,
            recompute_ratio=lookup.ratio if prefill.recompute_ratio is None else prefill.recompute_ratio,
            ttft_s=time.perf_counter() - start_s,
            num_prompt_tokens=layout.num_tokens,
            context_tokens=layout.num_context_tokens,
            reused_tokens_by_tier=_reused_by_tier(layout),
            recomputed_tokens=round(prefill.recomputed_fraction * layout.num_context_tokens)
            + layout.num_tokens
            - layout.num_context_tokens,
            recomputed_fraction=prefill.recomputed_fraction,
            first_token_logprobs=first_logits.log_softmax(-1),
        )

        def write_back() -> None:
            if mode.reads_chunk_cache:
                for seg in layout.segments:
                    if seg.cached is None and not seg.held and seg.kind != SUFFIX:
                        ids = layout.token_ids[seg.start : seg.end].tolist()
                        self._store(ids, seg.kind == PREFIX, prompt, request.namespace)

        return Generation(stats, iter_decode(self.runner, cache, first_logits, sampling), write_back)

    def generate(self, request: BlendRequest) -> BlendResult:
        """Answer one request; misses are computed in context now and written back after the answer."""
        generation = self.open(request)
        token_ids = list(generation)
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True).strip()
        return BlendResult(token_ids, text, generation.stats)

    def fuse(
        self,
        prompt: PromptLayout,
        mode_name: str,
        ratio: float,
        extra_capacity: int = 0,
        namespace: str = DEFAULT_NAMESPACE,
        cache: KVCache | None = None,
    ) -> tuple[KVCache, PrefillResult, BlendLayout]:
        """Fill a KV cache for the whole prompt with one fusion mode (no decoding); `cache`: fill this one."""
        cache, prefill, lookup = self._fuse(prompt, mode_name, ratio, extra_capacity, namespace, cache)
        return cache, prefill, lookup.layout

    def _fuse(
        self,
        prompt: PromptLayout,
        mode_name: str,
        ratio: float,
        extra_capacity: int,
        namespace: str,
        cache: KVCache | None = None,
    ) -> tuple[KVCache, PrefillResult, LookupResult]:
        """Look up, then run the mode's pass with the cached KV arriving through the loader."""
        limit = self.runner.config.max_position_embeddings
        if len(prompt.token_ids) + extra_capacity > limit:
            raise ValueError(
                f"prompt of {len(prompt.token_ids)} tokens plus max_tokens {extra_capacity} exceeds the "
                f"model's context of {limit} tokens"
            )
        needed = len(prompt.token_ids) + extra_capacity
        if cache is not None and cache.capacity < needed:
            raise ValueError(f"a cache of {cache.capacity} slots cannot hold the {needed} this request needs")
        cache = cache if cache is not None else self.runner.new_cache(needed)
        try:
            return self._fuse_once(prompt, mode_name, ratio, namespace, cache)
        except ChunkLost as err:  # a chunk vanished mid-stream from every tier: look everything up again
            _log.warning("blendserve: %s; retrying the request's lookups", err)
            return self._fuse_once(prompt, mode_name, ratio, namespace, cache)

    def _fuse_once(
        self, prompt: PromptLayout, mode_name: str, ratio: float, namespace: str, cache: KVCache
    ) -> tuple[KVCache, PrefillResult, LookupResult]:
        mode = self.modes[mode_name]
        lookup = self._lookup_layout(prompt, mode.reads_chunk_cache, namespace, ratio)
        observe = self.controller.observe if self.controller is not None else ignore_fetch
        with self.loader.start(lookup.layout, cache, self.runner.rerotate_keys, observe) as feed:
            prefill = mode.prefill(self.runner, lookup.layout, cache, lookup.ratio, feed)
        return cache, prefill, lookup

    def _lookup_layout(self, prompt: PromptLayout, reads_cache: bool, namespace: str, ratio: float) -> LookupResult:
        if not reads_cache:
            return LookupResult(BlendLayout.build(prompt, [None] * len(prompt.chunk_ids), None), ratio)
        cfg = self.runner.config
        layer_bytes_per_token = 2 * cfg.num_kv_heads * cfg.head_dim * self.runner.dtype.itemsize
        return lookup_layout(
            self.store,
            prompt,
            lambda is_prefix: self._context_ids(is_prefix, prompt),
            namespace,
            ratio,
            self.controller,
            layer_bytes_per_token,
        )

    def _context_ids(self, is_prefix: bool, prompt: PromptLayout) -> list[int]:
        """What a chunk's KV is computed after: nothing, or the prompt prefix (never for the prefix itself)."""
        return prompt.prefix_ids if self.chunk_context == "prefix" and not is_prefix else []

    def _tiers(self, ids: list[int], is_prefix: bool, prompt: PromptLayout, namespace: str) -> list[str]:
        return self.store.tiers_of(ids, self._context_ids(is_prefix, prompt), namespace)

    def _store(self, ids: list[int], is_prefix: bool, prompt: PromptLayout, namespace: str) -> None:
        context = self._context_ids(is_prefix, prompt)
        self.store.put(compute_chunk_kv(self.runner, ids, context), context, namespace)


def _reused_by_tier(layout: BlendLayout) -> dict[str, int]:
    """Tokens of reused KV per tier it was found in."""
    reused: dict[str, int] = {}
    for seg in layout.segments:
        if seg.cached is not None:
            reused[seg.cached.source_tier] = reused.get(seg.cached.source_tier, 0) + seg.num_tokens
    return reused
