"""Tier configuration by URL, and the registry that opens a tier from it."""
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kvplane.compression.registry import COMPRESSIONS, NONE
from kvplane.eviction.policy import POLICIES
from kvplane.tiers.fs import DEFAULT_TIMEOUT_S, FsspecTier, LocalFileTier
from kvplane.tiers.memory import MemoryTier
from kvplane.tiers.tier import Tier


@dataclass(slots=True)
class TierSpec:
    """One tier: `ram://`, `device://[torch device]`, `file:///dir`, or any fsspec URL such as `s3://bucket/prefix`."""

    name: str
    url: str
    capacity_bytes: int
    policy: str = "tinylfu"
    storage_options: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S  # per call to a remote backend (connect, each read)
    compression: str = NONE  # how entries written uncompressed are stored here (kvplane.compression)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tier needs a name")
        if "://" not in self.url:
            raise ValueError(f"tier URL needs a scheme (ram://, device://, file://, s3://...): {self.url!r}")
        if self.capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {self.capacity_bytes}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from {sorted(POLICIES)}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"unknown compression {self.compression!r}; choose from {sorted(COMPRESSIONS)}")

    @property
    def scheme(self) -> str:
        """URL scheme, e.g. `s3`."""
        return self.url.split("://", 1)[0]


def _default_device() -> torch.device:
    # The device tier is GPU HBM; a CPU-only machine keeps the same pool in host memory.
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _device_tier(spec: TierSpec) -> Tier:
    where = spec.url.split("://", 1)[1]
    return MemoryTier(spec.name, spec.capacity_bytes, torch.device(where) if where else _default_device())


_OPENERS: dict[str, Callable[[TierSpec], Tier]] = {
    "ram": lambda spec: MemoryTier(spec.name, spec.capacity_bytes, "cpu"),
    "device": _device_tier,
    "file": lambda spec: LocalFileTier(spec.name, spec.capacity_bytes, spec.url, spec.storage_options),
}


def open_tier(spec: TierSpec) -> Tier:
    """The tier a spec describes; URLs with other schemes go through fsspec."""
    opener = _OPENERS.get(spec.scheme)
    if opener is not None:
        return opener(spec)
    return FsspecTier(spec.name, spec.capacity_bytes, spec.url, spec.storage_options, spec.timeout_s)
