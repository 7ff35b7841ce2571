"""Copy a checkpoint directory from an fsspec URL (s3://, file://, a path) into a local directory, once."""
import json
import logging
import os
import posixpath
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from botocore.exceptions import BotoCoreError
from fsspec.spec import AbstractFileSystem

from kvplane.tiers.fs import with_timeouts

MARKER_NAME = ".blendserve-fetched.json"
# A filesystem's own folder at the root of a volume (ext4 makes it, root-owned): never ours to replace.
FILESYSTEM_ENTRIES = ("lost+found",)
REQUIRED_FILE = "config.json"
# Per connect and per read, not per file: a multi-GB safetensors streams in many reads.
FETCH_TIMEOUT_S = 30.0
_S3_PROTOCOLS = ("s3", "s3a")
# s3fs raises OSError for what S3 answers; botocore's own errors (no credentials, no connection) pass through.
_READ_ERRORS = (OSError, BotoCoreError)

_log = logging.getLogger(__name__)


class FetchError(Exception):
    """The source cannot be fetched: not a checkpoint, unreachable, or changed while copying."""


@dataclass(slots=True, frozen=True)
class FetchResult:
    """What `fetch_model` did: the checkpoint's files (relative path -> bytes), and whether DEST already held them."""

    dest: Path
    source: str
    sizes: dict[str, int]
    skipped: bool


def fetch_model(source: str, dest: Path, endpoint_url: str | None = None, region: str | None = None) -> FetchResult:
    """Make `dest` a complete copy of the checkpoint directory at `source`; nothing is copied if it already is.

    Whatever `dest` held before is replaced. A marker written last records the source and every file's size; a
    `dest` without a matching marker is fetched again. `dest` is swapped in by rename from a hidden sibling, or,
    when it is a mount point (a Kubernetes volume, which cannot be renamed), filled in place with the marker last.
    """
    dest = Path(dest).absolute()
    fs, root = source_filesystem(source, endpoint_url, region)
    canonical = fs.unstrip_protocol(root)
    sizes = list_checkpoint(fs, root, canonical)
    if holds_copy(dest, canonical, sizes):
        _log.info("%s already holds %s (%d files): nothing to fetch", dest, canonical, len(sizes))
        return FetchResult(dest, canonical, sizes, skipped=True)
    start_s = time.monotonic()
    marker = {"source": canonical, "sizes": sizes}
    try:
        if is_mount_point(dest):
            _fill_mount_point(fs, root, sizes, dest, marker)
        else:
            _replace_directory(fs, root, sizes, dest, marker)
    except OSError as error:
        raise FetchError(f"cannot write the copy in {dest}: {error}") from None
    _log.info("fetched %d files (%.1f MiB) from %s into %s in %.1f s", len(sizes), sum(sizes.values()) / 2**20,
              canonical, dest, time.monotonic() - start_s)
    return FetchResult(dest, canonical, sizes, skipped=False)


def is_mount_point(path: Path) -> bool:
    """Whether `path` is mounted on, bind mounts included (which `os.path.ismount` misses on the same device)."""
    if os.path.ismount(path):
        return True
    mountinfo = Path("/proc/self/mountinfo")
    if not mountinfo.exists():
        return False
    # Field 5 is the mount point, with spaces and other special characters written as octal escapes.
    points = {line.split()[4].encode().decode("unicode_escape") for line in mountinfo.read_text().splitlines()}
    return str(path) in points


def source_filesystem(source: str, endpoint_url: str | None, region: str | None) -> tuple[AbstractFileSystem, str]:
    """The filesystem and root path of `source`; S3 credentials come from the environment (AWS_* variables)."""
    protocol = fsspec.utils.get_protocol(source)
    client_kwargs = {k: v for k, v in {"endpoint_url": endpoint_url, "region_name": region}.items() if v}
    if client_kwargs and protocol not in _S3_PROTOCOLS:
        raise FetchError(f"--endpoint-url and --region apply to s3:// sources only, not {source}")
    # A fresh client without a listings cache: a second fetch in one process sees the bucket, and the AWS_*
    # credentials, as they are now.
    options: dict[str, Any] = {"use_listings_cache": False, "skip_instance_cache": True}
    if client_kwargs:
        options["client_kwargs"] = client_kwargs
    try:
        return fsspec.core.url_to_fs(source, **with_timeouts(protocol, options, FETCH_TIMEOUT_S))
    except (ImportError, ValueError) as error:
        raise FetchError(f"cannot read {source}: {error}") from None


def list_checkpoint(fs: AbstractFileSystem, root: str, source: str) -> dict[str, int]:
    """Relative path -> size of every file under `root`; refuses a directory without config.json."""
    try:
        found = fs.find(root, detail=True) if fs.isdir(root) else {}
    except _READ_ERRORS as error:
        raise FetchError(f"cannot list {source}: {error}") from None
    prefix = root.rstrip("/") + "/"
    sizes = {}
    for path, info in found.items():
        relative = path.removeprefix(prefix)
        # Skipped: "folder" placeholder objects, and a marker that came along when a fetched copy was uploaded.
        if info.get("type") != "file" or not path.startswith(prefix) or relative == MARKER_NAME:
            continue
        if any(part in ("", ".", "..") for part in relative.split("/")):
            raise FetchError(f"{source} holds {path!r}, which cannot be a local file name")
        sizes[relative] = int(info["size"])
    if not sizes:
        raise FetchError(f"{source} has no {REQUIRED_FILE}: nothing is there (a wrong bucket or prefix?)")
    if REQUIRED_FILE not in sizes:
        held = ", ".join(sorted(sizes)[:5]) + (", ..." if len(sizes) > 5 else "")
        raise FetchError(f"{source} has no {REQUIRED_FILE}, so it is not a model checkpoint directory (holds {held})")
    return dict(sorted(sizes.items()))


def holds_copy(dest: Path, source: str, sizes: dict[str, int]) -> bool:
    """Whether `dest` has the marker of a fetch of `source` with these files, and every file at its size."""
    try:
        marker = json.loads((dest / MARKER_NAME).read_text())
        return marker == {"source": source, "sizes": sizes} and all(
            (dest / name).stat().st_size == size for name, size in sizes.items())
    except (OSError, ValueError):
        return False


def _replace_directory(fs: AbstractFileSystem, root: str, sizes: dict[str, int], dest: Path,
                       marker: dict[str, Any]) -> None:
    # The host name keeps pods that share a volume apart, and lets a restarted container reuse its own name.
    host = socket.gethostname()
    staging = dest.with_name(f".{dest.name}.partial-{host}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _download(fs, root, sizes, staging)
        _write_marker(staging, marker)
        if dest.exists():
            retired = dest.with_name(f".{dest.name}.old-{host}")
            shutil.rmtree(retired, ignore_errors=True)
            dest.rename(retired)
            staging.rename(dest)
            shutil.rmtree(retired)
        else:
            staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fill_mount_point(fs: AbstractFileSystem, root: str, sizes: dict[str, int], dest: Path,
                      marker: dict[str, Any]) -> None:
    # A mount point cannot be renamed over: stage inside it, then move the files up; the marker goes last, so a
    # crash at any step leaves no marker and the next run fetches again.
    (dest / MARKER_NAME).unlink(missing_ok=True)
    staging = dest / f".blendserve-fetch.partial-{socket.gethostname()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _download(fs, root, sizes, staging)
        for entry in dest.iterdir():
            if entry == staging or entry.name in FILESYSTEM_ENTRIES:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        for entry in staging.iterdir():
            entry.rename(dest / entry.name)
        _write_marker(dest, marker)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _download(fs: AbstractFileSystem, root: str, sizes: dict[str, int], target: Path) -> None:
    names = list(sizes)
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
    try:
        fs.get([posixpath.join(root, name) for name in names], [str(target / name) for name in names])
    except _READ_ERRORS as error:
        raise FetchError(f"copying {fs.unstrip_protocol(root)} failed: {error}") from None
    for name, size in sizes.items():
        got = (target / name).stat().st_size
        if got != size:
            raise FetchError(f"{name} changed while it was copied: listed {size} bytes, got {got}")


def _write_marker(directory: Path, marker: dict[str, Any]) -> None:
    partial = directory / f"{MARKER_NAME}.partial"
    partial.write_text(json.dumps(marker, indent=1) + "\n")
    partial.rename(directory / MARKER_NAME)
