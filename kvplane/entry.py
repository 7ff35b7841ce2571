"""One chunk's cached KV as the store sees it."""
from dataclasses import dataclass

import torch

from kvplane.keys import fingerprint_tag


@dataclass(slots=True)
class KVEntry:
    """Chunk KV `[L, 2, T, H_kv, D]` (layers, K/V, tokens, KV heads, head dim) and its identity."""

    key: str
    kv: torch.Tensor
    token_ids: list[int]
    fingerprint: str
    source: str = ""  # the tier a read found it in ("" for an entry about to be stored)

    def __post_init__(self) -> None:
        if self.kv.dim() != 5 or self.kv.shape[1] != 2 or self.kv.shape[0] < 1:
            raise ValueError(f"kv must be [L, 2, T, H_kv, D], got {tuple(self.kv.shape)}")
        if self.kv.shape[2] != len(self.token_ids):
            raise ValueError(f"kv holds {self.kv.shape[2]} tokens but {len(self.token_ids)} token ids were given")
        # invalidate(fingerprint) finds entries by this prefix, so a key from another model must not slip in.
        if not self.key.startswith(fingerprint_tag(self.fingerprint)):
            raise ValueError(f"key {self.key!r} was not made for fingerprint {self.fingerprint!r}")

    @property
    def num_layers(self) -> int:
        """Number of transformer layers held."""
        return int(self.kv.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data."""
        return self.kv.numel() * self.kv.element_size()
