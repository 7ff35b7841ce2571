"""The worker's view of cached chunk KV: look up by token ids, the context they were computed after, and a tenant."""
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple, Protocol

import xxhash

from workers.chunks.impact import ImpactBook
from workers.chunks.kv import ChunkKV, ChunkLayers

DEFAULT_NAMESPACE = "default"
LOCAL_TIER = "local"


class ChunkRef(NamedTuple):
    """Where a chunk's KV is filed: its tokens, the context it was computed after, and the tenant."""

    token_ids: list[int]
    context_ids: list[int]
    namespace: str = DEFAULT_NAMESPACE


class ChunkStore(Protocol):
    """Where chunk KV is found and written back; kvplane's tiered store fills this role in a cluster."""

    impacts: ImpactBook  # each chunk's context impact over its uses, keyed like its chunks

    def get(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> ChunkKV | None:
        """The cached KV of these tokens computed after context_ids, or None on a miss."""

    def read_layers(
        self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE, tier: str | None = None
    ) -> ChunkLayers | None:
        """The chunk's layers from `tier` (the fastest holding it when None or gone there), or None on a miss."""

    def read_layers_many(self, refs: Sequence[ChunkRef]) -> list[ChunkLayers | None]:
        """`read_layers` of each chunk from the fastest tier holding it, in as few round trips as the store can."""

    def put(self, chunk: ChunkKV, context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        """Keep a chunk's KV for later requests."""

    def delete(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        """Drop the chunk (a variant no longer indexed)."""

    def note_impact(self, key: str, impact: float) -> None:
        """A chunk's mean impact so far, for the keeping that weighs it (nothing to do where none does)."""

    def tiers_of(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> list[str]:
        """The tiers holding the chunk, fastest first (empty when not cached)."""

    def contains(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Whether some tier holds the chunk (asks no slower tier once a faster one has it)."""

    def put_many(self, chunks: Sequence[tuple[ChunkKV, list[int], str]]) -> None:
        """`put` of each `(chunk, context_ids, namespace)`, in as few round trips as the store can."""

    def contains_many(self, refs: Sequence[ChunkRef]) -> list[bool]:
        """`contains` of each chunk, in as few round trips as the store can."""

    def tiers_of_many(self, refs: Sequence[ChunkRef]) -> list[list[str]]:
        """`tiers_of` of each chunk, in as few round trips as the store can."""

    def key(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> str:
        """The key the chunk is filed under."""

    def flush(self) -> None:
        """Finish writes still in flight, so every tier reports what it will hold."""


def stored_impact(store: ChunkStore, token_ids: list[int], context_ids: list[int], namespace: str) -> float | None:
    """The chunk's mean impact as the store keeps it; None before any use measured it."""
    found = store.impacts.get(store.key(token_ids, context_ids, namespace))
    return None if found is None else found.mean


def record_impact(
    store: ChunkStore, token_ids: list[int], context_ids: list[int], namespace: str, value: float
) -> None:
    """Fold a measured impact into the chunk's record, and tell the store's keeping."""
    key = store.key(token_ids, context_ids, namespace)
    store.note_impact(key, store.impacts.observe(key, value).mean)


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

    def read_layers_many(self, refs: Sequence[ChunkRef]) -> list[ChunkLayers | None]:
        return [self.read_layers(*ref) for ref in refs]

    def put(self, chunk: ChunkKV, context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        self.entries[(namespace, tuple(context_ids), tuple(chunk.token_ids))] = chunk

    def delete(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        """Drop the chunk (a variant no longer indexed)."""
        self.entries.pop((namespace, tuple(context_ids), tuple(token_ids)), None)

    def tiers_of(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> list[str]:
        return [LOCAL_TIER] if self.contains(token_ids, context_ids, namespace) else []

    def contains(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> bool:
        return (namespace, tuple(context_ids), tuple(token_ids)) in self.entries

    def put_many(self, chunks: Sequence[tuple[ChunkKV, list[int], str]]) -> None:
        for chunk, context_ids, namespace in chunks:
            self.put(chunk, context_ids, namespace)

    def contains_many(self, refs: Sequence[ChunkRef]) -> list[bool]:
        return [self.contains(*ref) for ref in refs]

    def tiers_of_many(self, refs: Sequence[ChunkRef]) -> list[list[str]]:
        return [self.tiers_of(*ref) for ref in refs]

    def key(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> str:
        ids = b"".join(t.to_bytes(4, "little") for t in [*context_ids, -1 & 0xFFFFFFFF, *token_ids])
        return f"{namespace}/{xxhash.xxh3_128_hexdigest(ids)}"

    def note_impact(self, key: str, impact: float) -> None:
        """Nothing is evicted here, so impacts weigh nothing."""

    def flush(self) -> None:
        """Nothing is ever in flight."""

    def clear(self) -> None:
        """Drop every chunk (impacts stay: they are small and describe the chunks, not their KV)."""
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)
