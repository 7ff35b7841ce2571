"""What a compression of one layer's KV is: its size, the bytes it writes, the tensor it reads back."""
from abc import ABC, abstractmethod

import numpy as np
import torch


class CompressionError(ValueError):
    """A layer this compression cannot represent (values outside its range); the caller stores it uncompressed."""


class Compression(ABC):
    """Turns a layer `[2, T, H_kv, D]` into bytes and back; `name` goes in the blob header."""

    name: str

    @abstractmethod
    def layer_nbytes(self, layer_shape: tuple[int, ...], dtype: torch.dtype) -> int:
        """Bytes one compressed layer of this shape takes."""

    @abstractmethod
    def compress(self, layer: torch.Tensor) -> torch.Tensor:
        """A layer `[2, T, H_kv, D]` as a 1-D uint8 tensor of `layer_nbytes`, on the layer's device."""

    @abstractmethod
    def decompress(self, data: torch.Tensor, layer_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Layers `[N, 2, T, H_kv, D]` in `dtype` from `[N, layer_nbytes]` compressed bytes, on their device."""
        # Several layers per call where they are at hand: on small chunks the per-call overhead dominates.


class NoCompression(Compression):
    """The layer's own bytes: decompressing is a view, not a copy."""

    name = "none"

    def layer_nbytes(self, layer_shape: tuple[int, ...], dtype: torch.dtype) -> int:
        count = 1
        for size in layer_shape:
            count *= size
        return count * dtype.itemsize

    def compress(self, layer: torch.Tensor) -> torch.Tensor:
        return layer.contiguous().reshape(-1).view(torch.uint8)

    def decompress(self, data: torch.Tensor, layer_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if data.shape[-1] == 0:  # a chunk of no tokens: nothing to view
            return torch.empty((data.shape[0], *layer_shape), dtype=dtype, device=data.device)
        return data.view(dtype).view(data.shape[0], *layer_shape)


def float32_output(num_layers: int, layer_shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Uninitialised float32 `[N, 2, T, H_kv, D]` for decompressed layers, on `device`."""
    # On the host, numpy's buffers get transparent huge pages: first-touch page faults, most of the cost of
    # fresh output memory, drop several-fold against torch.empty (kvplane.buffers.new_blob does the same).
    if device.type == "cpu":
        return torch.from_numpy(np.empty((num_layers, *layer_shape), dtype=np.float32))
    return torch.empty((num_layers, *layer_shape), dtype=torch.float32, device=device)
