"""Where a request's context KV waits until vLLM's worker writes it: an in-process registry or a file."""
import threading
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

_TENSOR_NAME = "kv"
_lock = threading.Lock()
_registry: dict[str, torch.Tensor] = {}


def put_kv(kv: torch.Tensor, key: str | None = None) -> str:
    """Hold `kv` ([L, 2, T, H_kv, D]) in this process under a key (fresh if None); returns the key."""
    _check_shape(kv)
    key = key or uuid.uuid4().hex
    with _lock:
        _registry[key] = kv
    return key


def get_kv(key: str) -> torch.Tensor | None:
    """The KV held under `key`, or None."""
    with _lock:
        return _registry.get(key)


def drop_kv(key: str) -> None:
    """Forget the KV held under `key` (no error if absent)."""
    with _lock:
        _registry.pop(key, None)


def num_held() -> int:
    """How many KV tensors the registry holds (for leak checks)."""
    with _lock:
        return len(_registry)


def save_kv_file(kv: torch.Tensor, path: Path) -> Path:
    """Write `kv` to a safetensors file a vLLM engine in another process can read; returns the path."""
    _check_shape(kv)
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    save_file({_TENSOR_NAME: kv.contiguous()}, str(partial))
    partial.rename(path)
    return path


def load_kv_file(path: Path) -> torch.Tensor:
    """Read a KV tensor written by save_kv_file."""
    return load_file(str(path))[_TENSOR_NAME]


def _check_shape(kv: torch.Tensor) -> None:
    if kv.dim() != 5 or kv.shape[1] != 2:
        raise ValueError(f"context KV must be [L, 2, T, H_kv, D], got {tuple(kv.shape)}")
