"""A chunk store that serves its chunks as a tier under a chosen compression would: for measuring compressions."""
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import torch

from kvplane.compression.registry import NONE, compression
from workers.chunks.kv import ChunkKV
from workers.chunks.store import DEFAULT_NAMESPACE, LocalChunkStore


def compress_chunk(kv: torch.Tensor, compression_name: str) -> torch.Tensor:
    """Chunk KV `[L, 2, T, H_kv, D]` as the stored bytes of its layers `[L, layer bytes]`."""
    codec = compression(compression_name)
    return torch.stack([codec.compress(layer) for layer in kv])


def decompress_chunk(
    stored: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, compression_name: str
) -> torch.Tensor:
    """The chunk's KV `[L, 2, T, H_kv, D]` from its stored layers, as a read from a compressed tier decodes it."""
    return compression(compression_name).decompress(stored, shape[1:], dtype)


class CompressedView(LocalChunkStore):
    """Chunks kept exact and under each of `compressions`; reads served under the active one."""

    # One store for every compression compared: chunk KV is computed once per record, compressed when it is
    # stored (as a tier does), and decompressed by each read (as a tier's reader does, so TTFT includes it).

    def __init__(self, compressions: Sequence[str] = ()) -> None:
        super().__init__()
        self.compressions = tuple(compression(name).name for name in compressions if name != NONE)
        self.packed: dict[tuple[str, tuple[int, ...], tuple[int, ...], str], torch.Tensor] = {}
        self.active = NONE

    @contextmanager
    def serving(self, compression_name: str) -> Iterator[None]:
        """Reads inside the block come back through `compression_name` (one of those given at construction)."""
        if compression_name != NONE and compression_name not in self.compressions:
            raise ValueError(f"this view keeps chunks under {list(self.compressions)}, not {compression_name!r}")
        previous, self.active = self.active, compression_name
        try:
            yield
        finally:
            self.active = previous

    def put(self, chunk: ChunkKV, context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        super().put(chunk, context_ids, namespace)
        where = (namespace, tuple(context_ids), tuple(chunk.token_ids))
        for name in self.compressions:
            self.packed[(*where, name)] = compress_chunk(chunk.kv, name)

    def delete(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        super().delete(token_ids, context_ids, namespace)
        for name in self.compressions:
            self.packed.pop((namespace, tuple(context_ids), tuple(token_ids), name), None)

    def clear(self) -> None:
        super().clear()
        self.packed.clear()

    def get(self, token_ids: list[int], context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> ChunkKV | None:
        found = super().get(token_ids, context_ids, namespace)
        if found is None or self.active == NONE:
            return found
        stored = self.packed[(namespace, tuple(context_ids), tuple(token_ids), self.active)]
        return replace(found, kv=decompress_chunk(stored, tuple(found.kv.shape), found.kv.dtype, self.active))
