"""A chunk read layer by layer, for the loader that overlaps loading with recompute."""
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kvplane.codec import ChunkHeader


class ChunkLost(LookupError):
    """A chunk vanished or failed its checksum mid-stream in every tier holding it: treat it as a miss."""


@dataclass(slots=True)
class LayerStream:
    """Header of a found chunk, the tier that served it, and its layers (`[2, T, H_kv, D]`, in order)."""

    header: ChunkHeader
    tier: str
    layers: Iterator[torch.Tensor]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self.layers

    @property
    def token_ids(self) -> list[int]:
        """Token ids of the chunk."""
        return self.header.token_ids

    @property
    def num_layers(self) -> int:
        """Layers the stream yields."""
        return self.header.num_layers
