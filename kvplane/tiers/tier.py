"""The storage interface every tier implements: blobs by key, whole or by byte range."""
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import torch


class TierError(OSError):
    """A tier's backend failed (unreachable, refused); the store counts it and treats it as a miss."""


class Tier(Protocol):
    """One storage level holding blobs (1-D uint8 tensors) by key."""

    # `put` may keep the blob it is given (callers never mutate a blob after handing it over), and
    # `read` returns a buffer the caller owns.

    name: str
    capacity_bytes: int
    # Each read costs a round trip (a Ray call, an HTTP request): a chunk's layers are streamed from one read.
    reads_whole: bool

    def put(self, key: str, blob: torch.Tensor) -> None:
        """Store `blob` under `key`, atomically: a reader sees the old state or the whole new blob."""

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Bytes `[start, end)` of the blob (to its end if `end` is None), or None if absent."""

    def delete(self, key: str) -> None:
        """Remove `key` if present."""

    def contains(self, key: str) -> bool:
        """Whether `key` is present."""

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Keys starting with `prefix`, with their blob sizes."""

    def sweep_temporaries(self, older_than_s: float) -> int:
        """Delete leftovers of writes that never finished, older than `older_than_s`; returns how many."""

    def hit_label(self) -> str | None:
        """Which inner tier served this thread's last whole-blob read (a tier over tiers); None for any other."""

    def label_of(self, key: str) -> str | None:
        """Which inner tier holds `key`, or None (a tier over tiers); any other tier answers its own name unasked."""


@runtime_checkable
class BatchedTier(Protocol):
    """A tier whose every call is a round trip (a Ray shard), so it takes several keys in one call."""

    def put_many(self, items: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Store each `(key, blob)` as `put` does."""

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is present."""

    def labels_of(self, keys: Sequence[str]) -> list[str | None]:
        """`label_of` of each key."""

    def read_whole_many(self, keys: Sequence[str]) -> list[tuple[torch.Tensor, str] | None]:
        """Each key's whole blob and the inner tier that served it (as `label_of` names it), or None."""
