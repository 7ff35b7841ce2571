"""The fusion core both engines compose: lay a request out, look its chunks up, fuse them with a mode, write back."""
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from kvplane.layer_stream import ChunkLost
from workers.chunks.batch_kv import compute_chunks_kv
from workers.chunks.kv import compute_chunk_kv
from workers.chunks.lookup import LookupResult, lookup_layout
from workers.chunks.sources import DEFAULT_CHUNK_CONTEXT, ChunkSource, ChunkSources, prompt_parts
from workers.chunks.store import (
    DEFAULT_NAMESPACE,
    ChunkRef,
    ChunkStore,
    LocalChunkStore,
    record_impact,
    stored_impact,
)
from workers.chunks.variants import Variant, VariantIndex, chunk_keys
from workers.engines.base import StoredChunk
from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.baselines.full_prefill import FullPrefill
from workers.fusion.layer_feed import LayerLoader, PipelinedLoader, TimedFeed, ignore_fetch
from workers.fusion.layout import PREFIX, SUFFIX, BlendLayout, Segment
from workers.fusion.registry import make_fusion_modes
from workers.fusion.selective_pass import PrefillResult
from workers.generation.conversation import Conversation
from workers.generation.prompt import PromptLayout, PromptTemplate
from workers.generation.text_stream import answer_text
from workers.loading.controller import LoadingController
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class FusedPrompt:
    """A prompt's KV as one fusion mode filled it, and the layout its cached parts were found in."""

    cache: KVCache
    prefill: PrefillResult
    layout: BlendLayout
    mode: FusionMode
    recompute_ratio: float  # the ratio the pass ran at: the controller's choice, or raised by the check layer
    lookup_s: float = 0.0  # opening the cached parts (headers from their tiers)
    load_wait_s: float = 0.0  # the pass waiting for layers still being read

    def reused_tokens_by_tier(self, end: int | None = None) -> dict[str, int]:
        """Tokens of reused KV before position `end` (all by default), per tier they were found in."""
        end = self.layout.num_tokens if end is None else end
        reused: dict[str, int] = {}
        for seg in self.layout.cached_segments():
            overlap = min(seg.end, end) - seg.start
            if seg.cached is not None and overlap > 0:
                reused[seg.cached.source_tier] = reused.get(seg.cached.source_tier, 0) + overlap
        return reused

    @property
    def missed(self) -> bool:
        """Whether a part the mode would have read from the chunk cache was not there (so is worth writing back)."""
        return self.mode.reads_chunk_cache and any(_missed(seg) for seg in self.layout.segments)


class Fuser:
    """One model's fusion: the runner it computes with, its modes, chunk store, prompt template and KV loader.

    With a `controller`, each request's ratio and per-chunk tier or recompute follow its plan. With
    `blending_refused` (the canary gate failed), every mode that reads cached chunks serves full prefill.
    `modes`: the registry requests choose from by name (every registered mode by default). With `variants`,
    chunks are read from their best-fitting variant, and write-back makes variants where they would pay off.
    """

    def __init__(  # noqa: PLR0913 - a constructor that stores the components it is given, keywords past options
        self,
        runner: ModelRunner,
        options: FusionOptions = FusionOptions(),
        *,
        store: ChunkStore | None = None,
        template: PromptTemplate | None = None,
        chunk_context: str = DEFAULT_CHUNK_CONTEXT,
        loader: LayerLoader | None = None,
        controller: LoadingController | None = None,
        blending_refused: str | None = None,
        modes: Mapping[str, FusionMode] | None = None,
        variants: VariantIndex | None = None,
    ) -> None:
        self.sources = ChunkSources.for_model(chunk_context, runner.config)
        self.runner = runner
        self.options = options
        self.store = store if store is not None else LocalChunkStore()
        self.template = template or PromptTemplate(runner.checkpoint.tokenizer)
        self.loader = loader if loader is not None else PipelinedLoader()
        self.controller = controller
        self.blending_refused = blending_refused
        modes = make_fusion_modes(options) if modes is None else dict(modes)
        if blending_refused is not None:
            full = FullPrefill(options)
            modes = {name: full if mode.reads_chunk_cache else mode for name, mode in modes.items()}
        self.modes = modes
        self.variants = variants

    @property
    def chunk_context(self) -> str:
        """What chunk KV is computed after (CHUNK_CONTEXTS), as the fuser was built with."""
        return self.sources.chunk_context

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer."""
        return self.runner.checkpoint.tokenizer

    def layout(self, documents: list[str], question: str, conversation: Conversation | None = None) -> PromptLayout:
        """Token layout of a request under the template."""
        return self.template.layout(documents, question, conversation)

    def ratio_for(self, recompute_ratio: float | None) -> float:
        """A request's ratio, or the configured default when it asks for none."""
        return self.options.recompute_ratio if recompute_ratio is None else recompute_ratio

    def missed_tokens(self, prompt: PromptLayout, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Tokens of the prompt's prefix and chunks whose KV, as this request reads it, no tier holds now."""
        parts = list(prompt_parts(prompt))
        sources = [self.sources.read_at(index, prompt, namespace) for index, _ in parts]
        refs = [ChunkRef(ids, s.context_ids, s.namespace) for (_, ids), s in zip(parts, sources)]
        held = self.store.contains_many(refs)
        return sum(len(ids) for (_, ids), is_held in zip(parts, held) if not is_held)

    def precompute(self, prompt: PromptLayout, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Compute and store the KV of every chunk (and the prefix) not yet cached; returns how many."""
        parts = [(ids, is_prefix) for ids, is_prefix in [(prompt.prefix_ids, True)] + [(ids, False) for ids in
                                                                                         prompt.chunk_ids] if ids]
        return sum(self._store_missing(parts, prompt, namespace))

    def store_documents(self, documents: list[str], namespace: str = DEFAULT_NAMESPACE) -> list[StoredChunk]:
        """Compute (if missing) and store each document's chunk KV; where each now lives, in order."""
        prompt = self.layout(documents, "")
        parts = [(ids, False) for ids in prompt.chunk_ids] + ([(prompt.prefix_ids, True)] if prompt.prefix_ids else [])
        computed = self._store_missing(parts, prompt, namespace)
        stored = [StoredChunk(len(ids), was_computed) for ids, was_computed in zip(prompt.chunk_ids, computed)]
        self.store.flush()
        context = self._context_ids(False, prompt)
        refs = [ChunkRef(ids, context, namespace) for ids in prompt.chunk_ids]
        for chunk, ref, tiers in zip(stored, refs, self.store.tiers_of_many(refs)):
            chunk.key = self.store.key(*ref)
            chunk.tiers = tiers
        return stored

    def fuse(
        self,
        prompt: PromptLayout,
        mode_name: str,
        recompute_ratio: float,
        namespace: str = DEFAULT_NAMESPACE,
        cache: KVCache | None = None,
        kv_end: int | None = None,
    ) -> FusedPrompt:
        """Fill `cache` (a new one when None) with the KV of the prompt's first `kv_end` tokens (all by default).

        The layout holds the whole prompt either way, so a mode may read the question.
        """
        kv_end = len(prompt.token_ids) if kv_end is None else kv_end
        cache = self.runner.new_cache(kv_end) if cache is None else cache
        if cache.capacity < kv_end:
            raise ValueError(f"a cache of {cache.capacity} slots cannot hold the {kv_end} this prompt needs")
        mode = self.modes[mode_name]
        try:
            return self._fuse_once(prompt, mode, recompute_ratio, cache, namespace, kv_end)
        except ChunkLost as err:  # a chunk vanished mid-stream from every tier: look everything up again
            _log.warning("blendserve: %s; retrying the request's lookups", err)
            return self._fuse_once(prompt, mode, recompute_ratio, cache, namespace, kv_end)

    def has_write_back(self, fused: FusedPrompt) -> bool:
        """Whether write_back would store anything: a missed part, or (with variants) a chunk-reading pass."""
        return fused.missed or (self.variants is not None and fused.mode.reads_chunk_cache)

    def write_back(self, fused: FusedPrompt, prompt: PromptLayout, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Compute and store the parts a chunk-reading mode missed (never the question)."""
        if not fused.mode.reads_chunk_cache:
            return
        for seg in fused.layout.segments:
            if _missed(seg):
                ids = fused.layout.token_ids[seg.start : seg.end].tolist()
                self._store_missing([(ids, seg.kind == PREFIX)], prompt, namespace)
        if self.variants is not None:
            self._make_variants(fused, prompt, namespace, self.variants)

    def store_next_turn(
        self,
        conversation: Conversation | None,
        question: str,
        answer_ids: list[int],
        prompt: PromptLayout,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> bool:
        """Store the KV of the prefix this conversation's next turn opens with, where it changes; whether computed.

        With the documents before the last question, the next turn's prefix holds this exchange (the client sends
        the answer back as the assistant's turn): its exact KV is computed now, between turns, so the next turn
        reads its whole prefix from the store instead of computing it before its first token.
        """
        ids = self.template.next_turn_prefix(conversation, question, answer_text(self.tokenizer, answer_ids))
        return bool(ids) and self._store_missing([(ids, True)], prompt, namespace)[0]

    def _make_variants(self, fused: FusedPrompt, prompt: PromptLayout, namespace: str, variants: VariantIndex) -> None:
        """Store, for each chunk the context reached strongly here, its KV computed after this request's context."""
        base = self._context_ids(False, prompt)
        keys = chunk_keys(self.store, prompt.chunk_ids, base, namespace)
        start = len(prompt.prefix_ids)
        for index, ids in enumerate(prompt.chunk_ids):
            impact = fused.prefill.chunk_impacts.get(start)
            if impact is None:  # a pass planned from stored impacts measures none: the stored mean stands in
                impact = stored_impact(self.store, ids, base, namespace)
            if impact is not None and variants.worth_creating(keys[index], keys[:index], impact):
                context = prompt.prefix_ids + [t for chunk in prompt.chunk_ids[:index] for t in chunk]
                self.store.put(compute_chunk_kv(self.runner, ids, context), context, namespace)
                dropped = variants.add(keys[index], Variant(tuple(keys[:index]), tuple(context)))
                if dropped is not None:
                    self.store.delete(ids, list(dropped.context_ids), namespace)
            start += len(ids)

    def _fuse_once(
        self,
        prompt: PromptLayout,
        mode: FusionMode,
        recompute_ratio: float,
        cache: KVCache,
        namespace: str,
        kv_end: int,
    ) -> FusedPrompt:
        began = time.perf_counter()
        lookup = self._lookup(prompt, mode.reads_chunk_cache, namespace, recompute_ratio, kv_end)
        lookup_s = time.perf_counter() - began
        observe = self.controller.observe if self.controller is not None else ignore_fetch
        with TimedFeed(self.loader.start(lookup.layout, cache, self.runner.rerotate_keys, observe)) as feed:
            prefill = mode.prefill(self.runner, lookup.layout, cache, lookup.recompute_ratio, feed)
        recompute_ratio = lookup.recompute_ratio if prefill.recompute_ratio is None else prefill.recompute_ratio
        self._record_impacts(prompt, lookup.layout, prefill, namespace)
        return FusedPrompt(cache, prefill, lookup.layout, mode, recompute_ratio, lookup_s, feed.waited_s)

    def _record_impacts(
        self, prompt: PromptLayout, layout: BlendLayout, prefill: PrefillResult, namespace: str
    ) -> None:
        """Fold the chunk impacts the mode measured into the store's running means."""
        context = self._context_ids(False, prompt)
        for seg in layout.chunk_segments():
            if seg.start in prefill.chunk_impacts:
                ids = layout.token_ids[seg.start : seg.end].tolist()
                record_impact(self.store, ids, context, namespace, prefill.chunk_impacts[seg.start])

    def _lookup(
        self, prompt: PromptLayout, reads_cache: bool, namespace: str, recompute_ratio: float, kv_end: int
    ) -> LookupResult:
        if not reads_cache:
            return LookupResult(
                BlendLayout.build(prompt, [None] * len(prompt.chunk_ids), None, kv_end=kv_end), recompute_ratio
            )
        cfg = self.runner.config
        layer_bytes_per_token = cfg.kv_values_per_token // cfg.num_layers * self.runner.dtype.itemsize
        return lookup_layout(
            self.store,
            prompt,
            sources=self.sources,
            namespace=namespace,
            recompute_ratio=recompute_ratio,
            controller=self.controller,
            layer_bytes_per_token=layer_bytes_per_token,
            kv_end=kv_end,
            variants=self.variants,
        )

    def stored_impacts(self, prompt: PromptLayout, namespace: str = DEFAULT_NAMESPACE) -> list[float | None]:
        """Each chunk's context impact as the store keeps it (None where no use has measured it)."""
        context = self._context_ids(False, prompt)
        return [stored_impact(self.store, ids, context, namespace) for ids in prompt.chunk_ids]

    def _context_ids(self, is_prefix: bool, prompt: PromptLayout) -> list[int]:
        """What a part's base KV is computed after: nothing, or the prompt prefix (never for the prefix itself)."""
        return self.sources.context_ids(is_prefix, prompt)

    def _store_missing(
        self, parts: list[tuple[list[int], bool]], prompt: PromptLayout, namespace: str
    ) -> list[bool]:
        """Compute and store each version of each part (ids, is_prefix) the store lacks; per part, whether any was.

        The missing versions that share a context are computed together, several per forward pass.
        """
        versions: list[tuple[int, list[int], ChunkSource]] = []  # (part, its ids, a version of it)
        seen: set[tuple[tuple[int, ...], bool]] = set()
        for part, (ids, is_prefix) in enumerate(parts):
            if (tuple(ids), is_prefix) not in seen:  # a document sent twice is computed once, for the first
                seen.add((tuple(ids), is_prefix))
                versions += [(part, ids, source) for source in self.sources.versions(is_prefix, prompt, namespace)]
        held = self.store.contains_many([ChunkRef(ids, s.context_ids, s.namespace) for _, ids, s in versions])
        missing: dict[tuple[tuple[int, ...], bool], list[tuple[list[int], ChunkSource]]] = {}
        computed = [False] * len(parts)
        for (part, ids, source), is_held in zip(versions, held):
            if not is_held:
                missing.setdefault((tuple(source.context_ids), source.hides_context), []).append((ids, source))
                computed[part] = True
        for (context, hides_context), wanted in missing.items():
            chunks = compute_chunks_kv(self.runner, [ids for ids, _ in wanted], context, hides_context)
            self.store.put_many([(chunk, s.context_ids, s.namespace) for chunk, (_, s) in zip(chunks, wanted)])
        return computed


def _missed(seg: Segment) -> bool:
    """A prefix or chunk the store did not have (a part the controller chose to recompute is still held)."""
    return seg.cached is None and not seg.held and seg.kind != SUFFIX
