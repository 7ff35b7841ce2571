"""The per-request message that tells BlendKVConnector which context KV to inject and for how many tokens."""
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workers.vllm.handoff import get_kv, load_kv_file

PARAMS_KEY = "blendserve"  # our entry inside a request's kv_transfer_params


@dataclass(frozen=True, slots=True)
class ContextKVParams:
    """Context KV of the first `num_tokens` prompt tokens: held in-process under `key`, or in a file at `path`."""

    num_tokens: int
    key: str | None = None
    path: str | None = None
    release: bool = True  # drop the in-process entry when the request finishes

    def __post_init__(self) -> None:
        if (self.key is None) == (self.path is None):
            raise ValueError("give exactly one of key (in-process registry) or path (safetensors file)")
        if self.num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {self.num_tokens}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (it travels through vLLM's engine-core serialization)."""
        return {"num_tokens": self.num_tokens, "key": self.key, "path": self.path, "release": self.release}

    @classmethod
    def from_kv_transfer_params(cls, params: dict[str, Any] | None) -> "ContextKVParams | None":
        """Our entry of a request's kv_transfer_params, or None when the request carries none."""
        entry = (params or {}).get(PARAMS_KEY)
        if entry is None:
            return None
        return cls(int(entry["num_tokens"]), entry.get("key"), entry.get("path"), bool(entry.get("release", True)))

    def is_available(self) -> bool:
        """Whether the KV can be read right now (the scheduler must not promise tokens it cannot load)."""
        return get_kv(self.key) is not None if self.key is not None else Path(self.path).is_file()

    def resolve(self) -> torch.Tensor:
        """The KV tensor [L, 2, T, H_kv, D]."""
        if self.key is not None:
            kv = get_kv(self.key)
            if kv is None:
                raise KeyError(f"no context KV registered under {self.key!r} in this process")
            return kv
        return load_kv_file(Path(self.path))

    def as_extra_args(self) -> dict[str, Any]:
        """What to pass as SamplingParams(extra_args=...) so vLLM hands it to the connector."""
        return {"kv_transfer_params": {PARAMS_KEY: self.to_dict()}}
