"""An LRU list of keys with byte sizes and a byte budget: the building block of the policies."""
from collections import OrderedDict
from collections.abc import Iterator


class Segment:
    """Keys in recency order (oldest first), with their sizes and a byte capacity."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._sizes: OrderedDict[str, int] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def overflow_bytes(self) -> int:
        """Bytes over capacity (<= 0 when within budget)."""
        return self.used_bytes - self.capacity_bytes

    def add(self, key: str, nbytes: int) -> None:
        """Insert `key` as the most recent."""
        self._sizes[key] = nbytes
        self.used_bytes += nbytes

    def pop(self, key: str) -> int:
        """Remove `key`, returning its size."""
        nbytes = self._sizes.pop(key)
        self.used_bytes -= nbytes
        return nbytes

    def pop_oldest(self) -> tuple[str, int]:
        """Remove and return the least recent key and its size."""
        key, nbytes = self._sizes.popitem(last=False)
        self.used_bytes -= nbytes
        return key, nbytes

    def refresh(self, key: str) -> None:
        """Mark `key` as the most recent."""
        self._sizes.move_to_end(key)

    def oldest(self) -> Iterator[tuple[str, int]]:
        """Keys and sizes from least to most recent."""
        return iter(self._sizes.items())
