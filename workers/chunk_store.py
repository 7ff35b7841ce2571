"""The worker's view of cached chunk KV: look up by token ids, the context they were computed after, and a tenant."""
from dataclasses import replace
from typing import Protocol

import xxhash

from workers.chunk_impact import ImpactBook
from workers.chunk_kv import ChunkKV, ChunkLayers

DEFAULT_NAMESPACE = "default"
LOCAL_TIER = "local"


class ChunkStore(Protocol):
    """Where chunk KV is found and written back; kvplane's tiered store fills this role in a cluster."""

    def get(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> ChunkKV | None:
        """The cached KV of these tokens computed after context_ids, or None on a miss."""

    def put(self, chunk: ChunkKV, context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        """Keep a chunk's KV for later requests."""

    def tiers_of(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> list[str]:
        """The tiers holding the chunk, fastest first (empty when not cached)."""

    def key(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> str:
        """The key the chunk is filed under."""

    def flush(self) -> None:
        """Finish writes still in flight, so every tier reports what it will hold."""


class LayeredChunkStore(ChunkStore, Protocol):
    """A chunk store that can also hand out a chunk layer by layer, from a chosen tier (optional in ChunkStore)."""

    def read_layers(
        self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE, tier: str | None = None
    ) -> ChunkLayers | None:
        """The chunk's layers from `tier` (the fastest holding it when None or gone there), or None on a miss."""


def read_chunk_layers(
    store: ChunkStore, token_ids: list[int], context_ids: list[int], namespace: str, tier: str | None = None
) -> ChunkLayers | None:
    """Layer by layer where the store supports it, else the whole chunk through `get`."""
    read_layers = getattr(store, "read_layers", None)
    if read_layers is not None:
        return read_layers(token_ids, context_ids, namespace, tier)
    chunk = store.get(token_ids, context_ids, namespace)
    return None if chunk is None else ChunkLayers.of(chunk)


class LocalChunkStore:
    """An unbounded in-process store keyed by namespace and the exact token ids, with each chunk's impact."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, tuple[int, ...], tuple[int, ...]], ChunkKV] = {}
        self.impacts = ImpactBook()

    def get(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> ChunkKV | None:
        found = self.entries.get((namespace, tuple(context_ids), tuple(token_ids)))
        return None if found is None else replace(found, source_tier=LOCAL_TIER)

    def read_layers(
        self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE, tier: str | None = None
    ) -> ChunkLayers | None:
        found = self.get(token_ids, context_ids, namespace)
        return None if found is None else ChunkLayers.of(found)

    def put(self, chunk: ChunkKV, context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        self.entries[(namespace, tuple(context_ids), tuple(chunk.token_ids))] = chunk

    def delete(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        """Drop the chunk (a variant no longer indexed)."""
        self.entries.pop((namespace, tuple(context_ids), tuple(token_ids)), None)

    def tiers_of(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> list[str]:
        return [LOCAL_TIER] if (namespace, tuple(context_ids), tuple(token_ids)) in self.entries else []

    def key(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> str:
        ids = b"".join(t.to_bytes(4, "little") for t in [*context_ids, -1 & 0xFFFFFFFF, *token_ids])
        return f"{namespace}/{xxhash.xxh3_128_hexdigest(ids)}"

    def flush(self) -> None:
        """Nothing is ever in flight."""

    def __len__(self) -> int:
        return len(self.entries)
