"""A request laid out for fusion: which token ranges are prefix, chunks and suffix, and which are cached."""
from dataclasses import dataclass, field

import torch

from workers.chunks.kv import ChunkKV, ChunkLayers
from workers.generation.prompt import PromptLayout
from workers.model.kv_cache import KVCache
from workers.model.rope import KeyRotation

PREFIX, CHUNK, SUFFIX = "prefix", "chunk", "suffix"


@dataclass(slots=True)
class Segment:
    """Tokens [start, end) of the sequence; `cached` holds reusable KV for them, if any."""

    start: int
    end: int
    kind: str
    cached: ChunkLayers | None = None
    held: bool = False  # the store holds this segment's KV even though it is recomputed (the controller's choice)

    @property
    def num_tokens(self) -> int:
        """Length of the segment."""
        return self.end - self.start

    def place(self, cache: KVCache, layer: int, kv: torch.Tensor, rotate: KeyRotation) -> None:
        """Write one cached layer `[2, T, H_kv, D]` at the segment's offset, keys re-rotated by that layer's RoPE."""
        assert self.cached is not None
        kv = kv.to(cache.data.device, non_blocking=True)  # from (pinned) host memory when the cache is on a GPU
        cache.data[layer, 0, self.start : self.end] = rotate(layer, kv[0], self.start - self.cached.base_position)
        cache.data[layer, 1, self.start : self.end] = kv[1]


@dataclass(slots=True)
class BlendLayout:
    """The whole prompt (question included) as one id sequence plus its segments in order.

    The pass computes KV for positions [0, kv_end): every token in the torch engine; the context in the vLLM
    engine, where vLLM prefills the question itself. Tokens past kv_end stay visible to the fusion modes (a
    mode may compute the question's queries over the assembled context) but are never written to the cache.
    """

    token_ids: torch.Tensor  # [N]
    segments: list[Segment]
    kv_end: int
    forced: torch.Tensor = field(init=False)  # [kv_end] bool: always recomputed (suffix, uncached, last token)
    chunks_follow_prefix: bool = True  # chunk KV was computed after this prompt's own prefix

    def __post_init__(self) -> None:
        if not 0 < self.kv_end <= len(self.token_ids):
            raise ValueError(f"kv_end must be in [1, {len(self.token_ids)}], got {self.kv_end}")
        self.forced = torch.zeros(self.kv_end, dtype=torch.bool)
        for seg in self.segments:
            if seg.cached is None:
                self.forced[seg.start : seg.end] = True
        self.forced[-1] = True

    @classmethod
    def build(
        cls,
        prompt: PromptLayout,
        cached: list[ChunkKV | ChunkLayers | None],
        cached_prefix: ChunkKV | ChunkLayers | None,
        held: frozenset[int] = frozenset(),
        kv_end: int | None = None,
    ) -> "BlendLayout":
        """Segments for prefix, each chunk (with its cached KV or None), and the suffix.

        `held`: indices of chunks (-1: the prefix) that are cached but recomputed by choice. `kv_end`: how many
        leading tokens the pass computes KV for (None: all).
        """
        if len(cached) != len(prompt.chunk_ids):
            raise ValueError(f"{len(cached)} cache entries for {len(prompt.chunk_ids)} chunks")
        parts = [(PREFIX, prompt.prefix_ids, cached_prefix, -1 in held)]
        parts += [(CHUNK, ids, kv, index in held) for index, (ids, kv) in enumerate(zip(prompt.chunk_ids, cached))]
        parts.append((SUFFIX, prompt.suffix_ids, None, False))
        segments, start = [], 0
        for kind, ids, kv, is_held in parts:
            if ids:
                layers = ChunkLayers.of(kv) if isinstance(kv, ChunkKV) else kv
                segments.append(Segment(start, start + len(ids), kind, layers, is_held))
                start += len(ids)
        if start == 0:
            raise ValueError("the prompt is empty")
        token_ids = torch.tensor(prompt.token_ids, dtype=torch.long)
        return cls(token_ids, segments, start if kv_end is None else kv_end, prompt.chunks_follow_prefix)

    @property
    def num_tokens(self) -> int:
        """Length of the whole sequence."""
        return len(self.token_ids)

    @property
    def num_context_tokens(self) -> int:
        """Tokens before the suffix (prefix and chunks)."""
        return sum(s.num_tokens for s in self.segments if s.kind != SUFFIX)

    @property
    def question(self) -> Segment | None:
        """The suffix (the question in its template), whether or not the pass computes its KV."""
        return next((s for s in self.segments if s.kind == SUFFIX), None)

    def chunk_segments(self) -> list[Segment]:
        """Cached document chunks, in prompt order."""
        return [s for s in self.segments if s.kind == CHUNK and s.cached is not None]

    def inexact_openings(self, span_tokens: int) -> list[tuple[int, int]]:
        """(start, end) of the first `span_tokens` positions below kv_end of each chunk whose cached KV is not exact."""
        exact_end = self.exact_end()
        ends = [(s.start, min(s.start + span_tokens, s.end, self.kv_end)) for s in self.chunk_segments()
                if s.start >= exact_end]
        return [(start, end) for start, end in ends if end > start]

    def exact_end(self) -> int:
        """End of the leading run of segments whose KV is what a full prefill computes there.

        A cached segment is exact when it sits where it was computed (the prefix at 0; with chunk KV computed
        after the prompt prefix, the first chunk) and everything before it is exact; an uncached one is
        computed in full, so exact too. Recomputing tokens before this position changes nothing.
        """
        end = 0
        for seg in self.segments:
            if seg.kind == SUFFIX or (seg.cached is not None and seg.cached.base_position != seg.start):
                break
            if seg.kind == CHUNK and seg.cached is not None and not self.chunks_follow_prefix:
                break  # computed after another prefix: not what a full prefill computes here, wherever it sits
            end = seg.end
        return min(end, self.kv_end)

    def budget_mask(self) -> torch.Tensor:
        """The tokens a recompute ratio is a share of: the cached chunks' unforced ones. # [kv_end] bool

        A cached prefix sits where it was computed and is never blended, so it takes no share: a conversation's
        growing prefix leaves the documents' budget as it is.
        """
        mask = torch.zeros(self.kv_end, dtype=torch.bool)
        for seg in self.chunk_segments():
            mask[seg.start : seg.end] = True
        return mask & ~self.forced

    def cached_segments(self) -> list[Segment]:
        """Every segment with cached KV to place (prefix and chunks), in order."""
        return [s for s in self.segments if s.cached is not None]

    def load_cached(self, cache: KVCache, rotate: KeyRotation) -> int:
        """Place every layer of each cached segment's KV at its offset, keys re-rotated; returns tokens placed."""
        placed = 0
        for seg in self.cached_segments():
            assert seg.cached is not None
            for layer, kv in enumerate(seg.cached.layers):
                seg.place(cache, layer, kv, rotate)
            placed += seg.num_tokens
        return placed
