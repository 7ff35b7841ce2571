"""A node's stable name under an SSD root (its Kubernetes node, else its host), a slot number per live holder."""
import fcntl
import hashlib
import logging
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

MAX_SLOTS = 64
NODE_NAME_ENV = "BLENDSERVE_NODE_NAME"  # set by the Helm chart from the downward API (spec.nodeName)
MAX_NAME_CHARS = 200  # `.<name>-63.lock` stays within the 255 bytes of a file name
MUTEX_NAME = ".slots.mutex"  # not `.*.lock`, so never taken for a slot's lock
TRASH_PREFIX = ".trash-"
_LOCK_SUFFIX = ".lock"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

_log = logging.getLogger(__name__)


def safe_name(raw: str) -> str:
    """`raw` as one plain folder name: unsafe characters as `_`, no leading dot, at most MAX_NAME_CHARS."""
    name = _UNSAFE.sub("_", raw).lstrip(".")
    if len(name) > MAX_NAME_CHARS:  # cut, with a hash of the whole name so that long names keep apart
        digest = hashlib.blake2b(raw.encode(), digest_size=4).hexdigest()
        name = f"{name[: MAX_NAME_CHARS - len(digest) - 1]}-{digest}"
    return name


def node_identity() -> str:
    """The Kubernetes node this pod runs on when the chart says so, else the host name; safe as a folder name."""
    # In a pod the host name is the pod's name, new for every pod: a folder named by it is abandoned by
    # the pod that replaces it. The node's name outlives its pods, like the hostPath volume under the root.
    return safe_name(os.environ.get(NODE_NAME_ENV, "")) or safe_name(socket.gethostname()) or "host"


class NodeSlot:
    """A claimed name under an SSD root, held by an exclusive lock for as long as this process lives."""

    # Ray gives a node a new id at every start, so an SSD folder named by it is never found again. A slot
    # is named by the node (see node_identity) and claimed with flock: a restarted node, shard or pod takes
    # back the first free slot of its node and finds its entries; two live holders never share one; the OS
    # releases the lock of a process that dies, however it dies.

    def __init__(self, name: str, root: Path, lock: IO[str]) -> None:
        self.name = name
        self.root = root
        self._lock = lock

    def release(self) -> None:
        """Give the slot up (a process that exits releases it anyway)."""
        self._lock.close()


def claim_slot(root: Path, name: str | None = None) -> NodeSlot:
    """The first of `<name>`, `<name>-1`, ... under `root` whose lock is free, claimed; stale slots are swept."""
    base = name or node_identity()
    root.mkdir(parents=True, exist_ok=True)
    with _mutex(root):
        slot = _claim_first_free(root, base)
        trash = _set_aside_stale_slots(root, keep=slot.name)
    for folder in trash:  # the slow part, outside the mutex: nobody else can reach these folders any more
        _remove(folder)
    return slot


def live_slots(root: Path) -> list[str]:
    """Names of the slots under `root` whose lock a live process holds (this process's own included)."""
    with _mutex(root):
        return sorted(name for name, lock_path in _slot_locks(root) if _is_held(lock_path))


def _claim_first_free(root: Path, base: str) -> NodeSlot:
    for slot in range(MAX_SLOTS):
        candidate = base if slot == 0 else f"{base}-{slot}"
        lock = open(_lock_path(root, candidate), "a+")  # stays open: the lock lasts as long as the file does
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return NodeSlot(candidate, root, lock)
    raise RuntimeError(f"all {MAX_SLOTS} node slots of {base} under {root} are taken")


def _set_aside_stale_slots(root: Path, keep: str) -> list[Path]:
    """Rename the folders of slots nobody holds (and earlier trash) to fresh trash names; returns them."""
    # Safe: a slot's lock is released only when its holder closes it or dies, and every claim and probe
    # runs under the mutex, so a lock found free here belongs to no live shard and none can take it before
    # the folder is gone. Only folders with a lock file are slots; anything else under the root is kept.
    trash: list[Path] = []
    for name, lock_path in _slot_locks(root):
        if name == keep:
            continue
        with open(lock_path, "r") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live pod's (or process's) slot
            folder = root / name
            if folder.is_dir():
                trash.append(folder.rename(root / f"{TRASH_PREFIX}{uuid.uuid4().hex}"))
                _log.warning("kvplane: swept the SSD slot %s under %s (its holder is gone)", name, root)
            lock_path.unlink(missing_ok=True)
    for left in list(root.glob(f"{TRASH_PREFIX}*")):  # a sweep that died half-way: taken over under a new name
        if left not in trash:
            trash.append(left.rename(root / f"{TRASH_PREFIX}{uuid.uuid4().hex}"))
    return trash


def _remove(folder: Path) -> None:
    try:
        shutil.rmtree(folder)
    except OSError as err:  # left for the next claim to take over
        _log.warning("kvplane: could not remove the swept SSD folder %s: %s", folder, err)


def _slot_locks(root: Path) -> list[tuple[str, Path]]:
    """(name, lock file) of every slot under `root`: names as safe_name makes them, never `` (the root)."""
    found = ((path.name[1 : -len(_LOCK_SUFFIX)], path) for path in root.glob(f".*{_LOCK_SUFFIX}"))
    return [(name, path) for name, path in found if name and safe_name(name) == name]


def _is_held(lock_path: Path) -> bool:
    try:
        with open(lock_path, "r") as probe:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # flock locks of two open files conflict, own too
    except BlockingIOError:
        return True
    except FileNotFoundError:
        return False
    return False


def _lock_path(root: Path, name: str) -> Path:
    return root / f".{name}{_LOCK_SUFFIX}"


@contextmanager
def _mutex(root: Path) -> Iterator[None]:
    """Claims, sweeps and counts of the slots under `root`, one at a time across processes."""
    # A probe takes a slot's lock for an instant: without the mutex a claim at that instant would skip
    # a free slot, and a sweep could remove the folder of a slot being claimed.
    with open(root / MUTEX_NAME, "a+") as mutex:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        yield
