"""The worker's view of cached chunk KV: look up by token ids (and the context they were computed after)."""
from typing import Protocol

from workers.chunk_kv import ChunkKV


class ChunkStore(Protocol):
    """Where chunk KV is found and written back; kvplane's tiered store fills this role in a cluster."""

    def get(self, token_ids: list[int], context_ids: list[int]) -> ChunkKV | None:
        """The cached KV of these tokens computed after context_ids, or None on a miss."""

    def put(self, chunk: ChunkKV, context_ids: list[int]) -> None:
        """Keep a chunk's KV for later requests."""


class LocalChunkStore:
    """An unbounded in-process store keyed by the exact token ids."""

    def __init__(self) -> None:
        self.entries: dict[tuple[tuple[int, ...], tuple[int, ...]], ChunkKV] = {}

    def get(self, token_ids: list[int], context_ids: list[int]) -> ChunkKV | None:
        return self.entries.get((tuple(context_ids), tuple(token_ids)))

    def put(self, chunk: ChunkKV, context_ids: list[int]) -> None:
        self.entries[(tuple(context_ids), tuple(chunk.token_ids))] = chunk

    def __len__(self) -> int:
        return len(self.entries)
