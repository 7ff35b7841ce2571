"""A node's stable name: the host name, plus a slot number when several Ray nodes share one host."""
import fcntl
import re
import socket
from pathlib import Path
from typing import IO

MAX_SLOTS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def host_identity() -> str:
    """This machine's host name, made safe as a folder name."""
    return _UNSAFE.sub("_", socket.gethostname()) or "host"


class NodeSlot:
    """A claimed name under an SSD root, held by an exclusive lock for as long as this process lives."""

    # Ray gives a node a new id at every start, so an SSD folder named by it is never found again. A slot
    # is named by the host and claimed with flock: a restarted node (or shard) takes back the first free
    # slot of its host and finds its entries; two nodes on one host never share one; the OS releases the
    # lock of a process that dies, however it dies.

    def __init__(self, name: str, lock: IO[str]) -> None:
        self.name = name
        self._lock = lock

    def release(self) -> None:
        """Give the slot up (a process that exits releases it anyway)."""
        self._lock.close()


def claim_slot(root: Path, host: str | None = None) -> NodeSlot:
    """The first of `<host>`, `<host>-1`, ... under `root` whose lock is free, claimed by this process."""
    name = host or host_identity()
    root.mkdir(parents=True, exist_ok=True)
    for slot in range(MAX_SLOTS):
        candidate = name if slot == 0 else f"{name}-{slot}"
        lock = open(root / f".{candidate}.lock", "a+")  # stays open: the lock lasts as long as the file does
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return NodeSlot(candidate, lock)
    raise RuntimeError(f"all {MAX_SLOTS} node slots of host {name} under {root} are taken")
