"""Approximate recent access counts per key (TinyLFU's frequency sketch)."""
import numpy as np
import xxhash

_DEPTH = 4
_MAX_COUNT = 15


class FrequencySketch:
    """Count-min sketch with 4-bit saturating counters, halved every `sample_factor * width` additions."""

    # Halving makes old popularity fade, so a chunk that was hot last hour does not block today's.

    def __init__(self, num_counters: int, sample_factor: int = 10) -> None:
        if num_counters < 1 or sample_factor < 1:
            raise ValueError("num_counters and sample_factor must be >= 1")
        width = 1 << max(4, (num_counters - 1).bit_length())
        self._table = np.zeros((_DEPTH, width), dtype=np.uint8)
        self._rows = np.arange(_DEPTH)
        self._mask = width - 1
        self._sample_size = sample_factor * width
        self._additions = 0

    @property
    def width(self) -> int:
        """Counters per row."""
        return self._mask + 1

    def ensure_capacity(self, num_keys: int) -> None:
        """Widen to >= 4 counters per tracked key; existing estimates carry over unchanged."""
        width = self.width
        while width < 4 * num_keys:
            width *= 2
        if width > self.width:
            # Slots are `hash & mask`: tiling keeps every key's old counter at its new slot.
            self._sample_size = self._sample_size // self.width * width
            self._table = np.tile(self._table, (1, width // self.width))
            self._mask = width - 1

    def add(self, key: str) -> None:
        """Count one access to `key` (conservative update: only the smallest counters grow)."""
        slots = self._slots(key)
        counts = self._table[self._rows, slots]
        low = counts.min()
        if low < _MAX_COUNT:
            self._table[self._rows, slots] = np.where(counts == low, low + 1, counts)
        self._additions += 1
        if self._additions >= self._sample_size:
            self._table >>= 1
            self._additions //= 2

    def estimate(self, key: str) -> int:
        """Estimated recent accesses of `key` (never an under-estimate before ageing)."""
        return int(self._table[self._rows, self._slots(key)].min())

    def _slots(self, key: str) -> np.ndarray:
        digest = xxhash.xxh3_128_intdigest(key.encode())
        return np.array([(digest >> (32 * row)) & self._mask for row in range(_DEPTH)])
