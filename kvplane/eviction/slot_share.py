"""One SSD budget per node: each live slot under the root holds at most its share, evicting its own entries."""
from collections import OrderedDict
from typing import TYPE_CHECKING

from kvplane.checks import check_count

if TYPE_CHECKING:  # the store wraps a registry policy in this one
    from kvplane.eviction.policy import EvictionPolicy


def slot_share_bytes(budget_bytes: int, num_live_slots: int) -> int:
    """A live slot's share of the node's budget: an equal part, so that the live slots together stay within it."""
    check_count("budget_bytes", budget_bytes, 0)
    check_count("num_live_slots", num_live_slots, 1)
    return budget_bytes // num_live_slots


class SlotSharePolicy:
    """Wraps a policy: the entries it keeps stay within a limit that may fall, oldest made room for first."""

    # The inner policy is sized for the node's whole budget and chooses as ever; this one only keeps its
    # bytes within the limit (this slot's share), evicting its own least recent entries, never another's.
    # An entry larger than the limit is refused, so the tier never writes past the share.

    def __init__(self, inner: "EvictionPolicy", limit_bytes: int) -> None:
        check_count("limit_bytes", limit_bytes, 0)
        self._inner = inner
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self._sizes: OrderedDict[str, int] = OrderedDict()  # least recent first

    def admit(self, key: str, nbytes: int, priority: float) -> list[str]:
        """Make room among the oldest entries to stay within the limit, then let the inner policy decide."""
        if self._inner.contains(key):
            return self._inner_admit(key, nbytes, priority)
        if nbytes > self.limit_bytes:
            return [key]
        own = self._evict_down_to(self.limit_bytes - nbytes)
        return own + self._inner_admit(key, nbytes, priority)

    def set_limit(self, limit_bytes: int) -> list[str]:
        """Hold at most `limit_bytes` from now on; returns the entries evicted to fit, oldest first."""
        check_count("limit_bytes", limit_bytes, 0)
        self.limit_bytes = limit_bytes
        return self._evict_down_to(limit_bytes)

    def note_impact(self, key: str, impact: float) -> None:
        """Pass a chunk's context impact on to the inner policy."""
        self._inner.note_impact(key, impact)

    def touch(self, key: str) -> None:
        """Record a read."""
        self._inner.touch(key)
        if key in self._sizes:
            self._sizes.move_to_end(key)

    def remove(self, key: str) -> None:
        """Forget `key`."""
        self._inner.remove(key)
        self._forget(key)

    def contains(self, key: str) -> bool:
        """Whether the inner policy holds `key`."""
        return self._inner.contains(key)

    def _inner_admit(self, key: str, nbytes: int, priority: float) -> list[str]:
        victims = self._inner.admit(key, nbytes, priority)
        for victim in victims:
            self._forget(victim)
        if key not in victims:
            if key in self._sizes:
                self._sizes.move_to_end(key)
            else:
                self._sizes[key] = nbytes
                self.used_bytes += nbytes
        return victims

    def _evict_down_to(self, target_bytes: int) -> list[str]:
        evicted = []
        while self.used_bytes > target_bytes and self._sizes:
            victim = next(iter(self._sizes))
            self._inner.remove(victim)
            self._forget(victim)
            evicted.append(victim)
        return evicted

    def _forget(self, key: str) -> None:
        nbytes = self._sizes.pop(key, None)
        if nbytes is not None:
            self.used_bytes -= nbytes
