"""Tiers on an fsspec filesystem: any URL (s3://, gs://, ...), plus a fast path for local disk."""
import posixpath
import uuid
from contextlib import contextmanager
from collections.abc import Iterator
from typing import Any

import fsspec
import torch

from kvplane.buffers import host_view, new_blob, owned_blob
from kvplane.keys import is_chunk_key, key_dir, key_path
from kvplane.tier import TierError


class FsspecTier:
    """Blobs as objects under a root URL; one PUT per blob (object stores publish PUTs atomically)."""

    def __init__(self, name: str, capacity_bytes: int, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.url = url
        # No listings cache: other nodes write to shared buckets, and a cached listing would hide them.
        self._fs, self._root = fsspec.core.url_to_fs(url, **{"use_listings_cache": False, **(storage_options or {})})

    def put(self, key: str, blob: torch.Tensor) -> None:
        """Write the blob in one request."""
        with _as_tier_error(self.name):
            self._fs.pipe_file(self._path(key), bytes(host_view(blob)))

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Bytes `[start, end)` in one ranged GET, or None if the object is absent."""
        try:
            with _as_tier_error(self.name):
                data = self._fs.cat_file(self._path(key), start=start, end=end)
        except FileNotFoundError:
            return None
        return owned_blob(data)

    def delete(self, key: str) -> None:
        """Remove the object if present."""
        try:
            with _as_tier_error(self.name):
                self._fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def contains(self, key: str) -> bool:
        """Whether the object exists."""
        with _as_tier_error(self.name):
            return bool(self._fs.exists(self._path(key)))

    def scan(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Stored keys starting with `prefix` (temporary files of unfinished writes are skipped)."""
        base = posixpath.join(self._root, key_dir(prefix)).rstrip("/")
        with _as_tier_error(self.name):
            found = self._fs.find(base, detail=True) if self._fs.exists(base) else {}
        for path, info in found.items():
            name = posixpath.basename(path)
            if is_chunk_key(name) and name.startswith(prefix):
                yield name, int(info["size"])

    def _path(self, key: str) -> str:
        return posixpath.join(self._root, key_path(key))


class LocalFileTier(FsspecTier):
    """Local disk (`file://`): writes go to a temp file renamed into place; reads land in one buffer."""

    def put(self, key: str, blob: torch.Tensor) -> None:
        """Write beside the target, then rename: a crash mid-write never leaves a partial entry at `key`."""
        path = self._path(key)
        temp = f"{path}.tmp-{uuid.uuid4().hex}"
        with _as_tier_error(self.name):
            self._fs.makedirs(posixpath.dirname(path), exist_ok=True)
            with self._fs.open(temp, "wb") as file:
                file.write(host_view(blob))
            self._fs.mv(temp, path)

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """Bytes `[start, end)` read straight into a fresh tensor (no intermediate bytes object)."""
        try:
            with _as_tier_error(self.name), self._fs.open(self._path(key), "rb") as file:
                stop = file.size if end is None else min(end, file.size)
                out = new_blob(max(0, stop - start))
                file.seek(start)
                got = file.readinto(out.numpy())
        except FileNotFoundError:
            return None
        return out[:got]


@contextmanager
def _as_tier_error(tier_name: str) -> Iterator[None]:
    """Turn backend failures other than absence into TierError."""
    try:
        yield
    except (FileNotFoundError, TierError):
        raise
    except Exception as err:  # network, auth, throttling, full disk: the tier failed, the store sees a miss
        raise TierError(f"tier {tier_name}: {err!r}") from err
