"""Tiers on an fsspec filesystem: any URL (s3://, gs://, ...), plus a fast path for local disk."""
import logging
import os
import posixpath
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fsspec
import torch

from kvplane.buffers import host_view, new_blob, owned_blob
from kvplane.keys import is_chunk_key, key_dir, key_path
from kvplane.tiers.tier import TierError

TEMPORARY_MARK = ".tmp-"
DEFAULT_TIMEOUT_S = 3.0
_S3_PROTOCOLS = ("s3", "s3a")

_log = logging.getLogger(__name__)


class FsspecTier:
    """Blobs as objects under a root URL; one PUT per blob (object stores publish PUTs atomically)."""

    reads_whole = True  # every ranged read is a request to the object store

    def __init__(
        self,
        name: str,
        capacity_bytes: int,
        url: str,
        storage_options: dict[str, Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.url = url
        # No listings cache: other nodes write to shared buckets, and a cached listing would hide them.
        protocol = url.split("://", 1)[0]
        options = with_timeouts(protocol, {"use_listings_cache": False, **(storage_options or {})}, timeout_s)
        self._fs, self._root = fsspec.core.url_to_fs(url, **options)
        if protocol in _S3_PROTOCOLS:
            # s3fs retries five times on top of botocore's tries and takes no option for it: one try here.
            self._fs.retries = 1

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

    def sweep_temporaries(self, older_than_s: float) -> int:
        """Writes here leave no temporaries."""
        return 0

    def hit_label(self) -> str | None:
        """No inner tiers to name."""
        return None

    def label_of(self, key: str) -> str:
        """No inner tiers: this tier's own name, without looking."""
        return self.name

    def _path(self, key: str) -> str:
        return posixpath.join(self._root, key_path(key))


def with_timeouts(protocol: str, options: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Storage options with bounded calls: an S3 endpoint that hangs costs `timeout_s` per try, two tries at most."""
    # botocore waits 60 s to connect and 60 s per read by default, and s3fs retries five times on top:
    # a stalled endpoint would hold a request for minutes. Options given explicitly win.
    if protocol not in _S3_PROTOCOLS:
        return options
    retries = {"total_max_attempts": 2, "mode": "standard"}  # max_attempts would count retries only: three tries
    config = {"connect_timeout": timeout_s, "read_timeout": timeout_s, "retries": retries}
    return {**options, "config_kwargs": {**config, **options.get("config_kwargs", {})}}


class LocalFileTier(FsspecTier):
    """Local disk (`file://`): writes go to a temp file renamed into place; reads land in one buffer."""

    reads_whole = False  # a local read is cheap: stream layer by layer, overlapped with compute

    def put(self, key: str, blob: torch.Tensor) -> None:
        """Write beside the target, then rename: a crash mid-write never leaves a partial entry at `key`."""
        path = self._path(key)
        temp = f"{path}{TEMPORARY_MARK}{uuid.uuid4().hex}"
        with _as_tier_error(self.name):
            self._fs.makedirs(posixpath.dirname(path), exist_ok=True)
            with self._fs.open(temp, "wb") as file:
                file.write(host_view(blob))
            self._fs.mv(temp, path)

    def sweep_temporaries(self, older_than_s: float) -> int:
        """Delete temporary files of writes that never finished (older than `older_than_s`); returns how many."""
        deadline_s = time.time() - older_than_s
        removed = 0
        for folder, _dirs, names in os.walk(self._root):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if TEMPORARY_MARK in name and os.stat(path).st_mtime <= deadline_s:
                        os.remove(path)
                        removed += 1
                except FileNotFoundError:  # finished (renamed) or swept by someone else meanwhile
                    continue
        if removed:
            _log.warning("kvplane: tier %s swept %d temporary files of interrupted writes", self.name, removed)
        return removed

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
