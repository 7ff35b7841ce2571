"""Chunk KV kept in kvplane's tiered store, keyed by content under the model fingerprint and a tenant."""
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import xxhash

from kvplane.entry import KVEntry
from kvplane.keys import chunk_key
from kvplane.layer_stream import LayerStream
from kvplane.store import TieredStore
from workers.chunks.impact import ImpactBook
from workers.chunks.kv import ChunkKV, ChunkLayers
from workers.chunks.sources import ChunkSources
from workers.chunks.store import DEFAULT_NAMESPACE, ChunkRef

if TYPE_CHECKING:  # annotations only, as in sources.py
    from workers.generation.prompt import PromptLayout


def chunk_store_key(fingerprint: str, namespace: str, token_ids: list[int], context_ids: list[int]) -> str:
    """Content key; KV computed after a context differs from KV computed alone, so the context is in it."""
    if context_ids:
        context = b"".join(t.to_bytes(4, "little") for t in context_ids)
        namespace = f"{namespace}\0context:{xxhash.xxh3_128_hexdigest(context)}"
    return chunk_key(fingerprint, namespace, token_ids)


def route_keys(sources: ChunkSources, prompt: "PromptLayout", fingerprint: str, namespace: str) -> list[str]:
    """The key of the stored version each chunk of `prompt` reads at its place: what the worker looks up first."""
    keys = []
    for index, ids in enumerate(prompt.chunk_ids):
        source = sources.read_at(index, prompt, namespace)
        keys.append(chunk_store_key(fingerprint, source.namespace, ids, source.context_ids))
    return keys


def _chunk_layers(stream: LayerStream | None, token_ids: list[int], context_ids: list[int]) -> ChunkLayers | None:
    """A found stream as the engine reads it; None for a miss or a key that holds other tokens."""
    if stream is None or stream.token_ids != list(token_ids):
        return None
    return ChunkLayers(stream.token_ids, iter(stream), stream.num_layers, len(context_ids), stream.tier)


class KVPlaneChunkStore:
    """The engine's ChunkStore over a TieredStore: RAM, SSD and object tiers, misses written back.

    Each chunk's context impact is kept beside it (`impacts`, this worker's uses) and handed to the tiers'
    policies, so one that weighs impact (impact_tinylfu) keeps the chunks that save the most.
    """

    def __init__(self, tiered: TieredStore, fingerprint: str, decode_device: torch.device | None = None) -> None:
        self.tiered = tiered
        self.fingerprint = fingerprint
        self.decode_device = decode_device  # a GPU runner's device: compressed layers are decoded there
        self.impacts = ImpactBook()

    def note_impact(self, key: str, impact: float) -> None:
        """Tell the tiers' policies a chunk's mean impact so far."""
        self.tiered.note_impact(key, impact)

    def key(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> str:
        """The key this store files the chunk under."""
        return chunk_store_key(self.fingerprint, namespace, token_ids, context_ids)

    def get(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> ChunkKV | None:
        """The stored chunk, or None on a miss (a damaged entry is already a miss inside the store)."""
        entry = self.tiered.get(self.key(token_ids, context_ids, namespace))
        if entry is None or entry.token_ids != list(token_ids):
            return None
        return ChunkKV(entry.token_ids, entry.kv, len(context_ids), entry.source)

    def read_layers(
        self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE, tier: str | None = None
    ) -> ChunkLayers | None:
        """The stored chunk as a layer stream from `tier` (or the fastest tier holding it), or None on a miss."""
        stream = self.tiered.read_layers(self.key(token_ids, context_ids, namespace), tier, self.decode_device)
        return _chunk_layers(stream, token_ids, context_ids)

    def read_layers_many(self, refs: Sequence[ChunkRef]) -> list[ChunkLayers | None]:
        """Each chunk as a layer stream from the fastest tier holding it: the node shards asked once for them all."""
        streams = self.tiered.read_layers_many([self.key(*ref) for ref in refs], self.decode_device)
        return [_chunk_layers(stream, ref.token_ids, ref.context_ids) for stream, ref in zip(streams, refs)]

    def put(self, chunk: ChunkKV, context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        """Write the chunk to the top tier now and to the lower tiers in the background."""
        self.tiered.put(self._entry(chunk, context_ids, namespace))

    def _entry(self, chunk: ChunkKV, context_ids: list[int], namespace: str) -> KVEntry:
        key = self.key(chunk.token_ids, context_ids, namespace)
        return KVEntry(key, chunk.kv.contiguous(), list(chunk.token_ids), self.fingerprint)

    def put_many(self, chunks: Sequence[tuple[ChunkKV, list[int], str]]) -> None:
        """Write several `(chunk, context_ids, namespace)`: over the node shards, one call per shard for them all."""
        self.tiered.put_many([self._entry(chunk, context_ids, namespace) for chunk, context_ids, namespace in chunks])

    def contains_many(self, refs: Sequence[ChunkRef]) -> list[bool]:
        """`contains` of each chunk, each tier asked once."""
        return self.tiered.contains_many([self.key(*ref) for ref in refs])

    def tiers_of_many(self, refs: Sequence[ChunkRef]) -> list[list[str]]:
        """`tiers_of` of each chunk, each tier asked once."""
        return self.tiered.tiers_holding_many([self.key(*ref) for ref in refs])

    def delete(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        """Drop the chunk from every tier (a variant no longer indexed)."""
        self.tiered.delete(self.key(token_ids, context_ids, namespace))

    def tiers_of(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> list[str]:
        """The tiers holding the chunk, fastest first."""
        return self.tiered.tiers_holding(self.key(token_ids, context_ids, namespace))

    def contains(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Whether some tier holds the chunk: the fastest that knows it answers, no slower one is asked."""
        return self.tiered.contains(self.key(token_ids, context_ids, namespace))

    def flush(self) -> None:
        """Finish the background writes to the lower tiers."""
        self.tiered.flush()
