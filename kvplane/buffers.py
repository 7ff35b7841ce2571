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
