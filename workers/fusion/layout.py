"""A request laid out for fusion: which token ranges are prefix, chunks and suffix, and which are cached."""
from dataclasses import dataclass, field

import torch

from workers.chunk_kv import ChunkKV
from workers.kv_cache import KVCache
from workers.prompt import PromptLayout
from workers.rope import rerotate

PREFIX, CHUNK, SUFFIX = "prefix", "chunk", "suffix"


@dataclass(slots=True)
class Segment:
    """Tokens [start, end) of the sequence; `cached` holds reusable KV for them, if any."""

    start: int
    end: int
    kind: str
    cached: ChunkKV | None = None

    @property
    def num_tokens(self) -> int:
        """Length of the segment."""
        return self.end - self.start


@dataclass(slots=True)
class BlendLayout:
    """The whole prompt as one id sequence plus its segments in order."""

    token_ids: torch.Tensor  # [N]
    segments: list[Segment]
    forced: torch.Tensor = field(init=False)  # [N] bool: always recomputed (suffix, uncached, last token)

    def __post_init__(self) -> None:
        self.forced = torch.zeros(len(self.token_ids), dtype=torch.bool)
        for seg in self.segments:
            if seg.cached is None:
                self.forced[seg.start : seg.end] = True
        self.forced[-1] = True

    @classmethod
    def build(cls, prompt: PromptLayout, cached: list[ChunkKV | None], cached_prefix: ChunkKV | None) -> "BlendLayout":
        """Segments for prefix, each chunk (with its cached KV or None), and the suffix."""
        if len(cached) != len(prompt.chunk_ids):
            raise ValueError(f"{len(cached)} cache entries for {len(prompt.chunk_ids)} chunks")
        parts = [(PREFIX, prompt.prefix_ids, cached_prefix)]
        parts += [(CHUNK, ids, kv) for ids, kv in zip(prompt.chunk_ids, cached)]
        parts.append((SUFFIX, prompt.suffix_ids, None))
        segments, start = [], 0
        for kind, ids, kv in parts:
            if ids:
                segments.append(Segment(start, start + len(ids), kind, kv))
                start += len(ids)
        if start == 0:
            raise ValueError("the prompt is empty")
        return cls(torch.tensor(prompt.token_ids, dtype=torch.long), segments)

    @property
    def num_tokens(self) -> int:
        """Length of the whole sequence."""
        return len(self.token_ids)

    @property
    def num_context_tokens(self) -> int:
        """Tokens before the suffix (prefix and chunks)."""
        return sum(s.num_tokens for s in self.segments if s.kind != SUFFIX)

    def chunk_segments(self) -> list[Segment]:
        """Cached document chunks, in prompt order."""
        return [s for s in self.segments if s.kind == CHUNK and s.cached is not None]

    def load_cached(self, cache: KVCache, inv_freq: torch.Tensor) -> int:
        """Place each cached segment's KV at its offset, keys re-rotated; returns tokens placed."""
        placed = 0
        for seg in self.segments:
            if seg.cached is None:
                continue
            kv = seg.cached.kv
            cache.data[:, 0, seg.start : seg.end] = rerotate(kv[:, 0], inv_freq, seg.start - seg.cached.base_position)
            cache.data[:, 1, seg.start : seg.end] = kv[:, 1]
            placed += seg.num_tokens
        return placed
