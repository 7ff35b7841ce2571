"""Blobs are 1-D uint8 tensors (host or device): the one currency between codec, tiers and store."""
import numpy as np
import torch


def host_view(blob: torch.Tensor) -> memoryview:
    """Bytes of a blob without a copy when it lives on the host (device blobs are copied over)."""
    host = blob if blob.device.type == "cpu" else blob.cpu()
    return memoryview(host.contiguous().numpy())


def owned_blob(data: bytes | bytearray | memoryview | np.ndarray) -> torch.Tensor:
    """A private, writable blob holding a copy of `data` (for buffers someone else may reuse or share)."""
    array = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    return torch.from_numpy(array.copy())


def copy_bytes(target: torch.Tensor, source: torch.Tensor) -> None:
    """Copy `source` into `target` (same byte length); host-to-host goes through numpy."""
    # torch's CPU copy fans out over its thread pool, which stalls for milliseconds when the cores are
    # busy with model work; a single-threaded memcpy runs at memory speed regardless.
    if target.device.type == "cpu" and source.device.type == "cpu":
        np.copyto(target.numpy(), source.numpy())
    else:
        target.copy_(source)


def new_blob(nbytes: int) -> torch.Tensor:
    """An uninitialised host blob."""
    # numpy asks for transparent huge pages on large buffers: first-touch page faults, the main cost
    # of handing out fresh memory, drop several-fold against torch.empty.
    return torch.from_numpy(np.empty(nbytes, dtype=np.uint8))


def clone_bytes(blob: torch.Tensor) -> torch.Tensor:
    """A private copy of a blob, on the blob's device."""
    copy = new_blob(blob.numel()) if blob.device.type == "cpu" else torch.empty_like(blob)
    copy_bytes(copy, blob)
    return copy
