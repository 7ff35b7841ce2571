"""A request's contiguous KV buffer for all layers, with room to append decoded tokens."""
import torch

from workers.model.config import ModelConfig


class KVCache:
    """Keys and values of one sequence at positions 0..length-1. # [L, 2, capacity, H_kv, D]"""

    def __init__(
        self,
        config: ModelConfig,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        storage: torch.Tensor | None = None,
    ) -> None:
        """A fresh buffer on `device`, or the first `capacity` slots of `storage` [L, 2, >= capacity, H_kv, D]."""
        shape = (config.num_layers, 2, capacity, config.num_kv_heads, config.head_dim)
        if storage is None:
            # not zeroed: every slot is written (loaded or computed) before attention reads it, and zeroing the
            # ~140 MB of a 6k-token context cost ~20 ms per request
            self.data = torch.empty(shape, dtype=dtype, device=device)
        else:
            fits = storage.dtype == dtype and storage.dim() == 5 and storage.shape[2] >= capacity
            if not fits or (storage.shape[:2], storage.shape[3:]) != (shape[:2], shape[3:]):
                raise ValueError(f"storage {tuple(storage.shape)} {storage.dtype} cannot hold a {shape} {dtype} cache")
            self.data = storage[:, :, :capacity]
        self.length = 0

    @property
    def capacity(self) -> int:
        """How many token slots the buffer holds."""
        return self.data.shape[2]

    def layer(self, layer: int, end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of K and V of one layer for slots [0, end). # [N, H_kv, D] each"""
        n = self.length if end is None else end
        return self.data[layer, 0, :n], self.data[layer, 1, :n]

    def write(self, layer: int, slots: torch.Tensor | slice, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store fresh K and V of some tokens of one layer."""
        self.data[layer, 0, slots] = k
        self.data[layer, 1, slots] = v
