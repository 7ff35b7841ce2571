"""A tier in process memory on one torch device: host RAM, or GPU HBM for the device tier."""
from collections.abc import Iterator

import torch

from kvplane.buffers import clone_bytes


class MemoryTier:
    """Blobs held as uint8 tensors on `device`; reads hand out private copies."""

    reads_whole = False  # a read is a slice in this process: layers are read one at a time

    def __init__(self, name: str, capacity_bytes: int, device: torch.device | str = "cpu") -> None:
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.device = torch.device(device)
        self._blobs: dict[str, torch.Tensor] = {}

    def put(self, key: str, blob: torch.Tensor) -> None:
        """Keep `blob` (moved to this tier's device, copied only if it lives elsewhere)."""
        self._blobs[key] = blob.to(self.device)

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """A copy of bytes `[start, end)`: callers may write into what they get (e.g. re-rotate K)."""
        blob = self._blobs.get(key)
        return None if blob is None else clone_bytes(blob[start:end])

    def delete(self, key: str) -> None:
        """Drop `key`."""
        self._blobs.pop(key, None)

    def contains(self, key: str) -> bool:
        """Whether `key` is held."""
        return key in self._blobs

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Held keys starting with `prefix`."""
        return iter([(key, blob.numel()) for key, blob in list(self._blobs.items()) if key.startswith(prefix)])

    def sweep_temporaries(self, older_than_s: float) -> int:
        """Writes here leave no temporaries."""
        return 0

    def hit_label(self) -> str | None:
        """No inner tiers to name."""
        return None

    def label_of(self, key: str) -> str:
        """No inner tiers: this tier's own name, without looking."""
        return self.name
