"""A policy that tracks nothing, for tiers that manage their own capacity (node shards)."""


class PassthroughPolicy:
    """Admits everything and never evicts: the tier behind it enforces its own budget."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes

    def admit(self, key: str, nbytes: int, priority: float) -> list[str]:
        """Admit `key`; nothing to evict."""
        return []

    def touch(self, key: str) -> None:
        """Reads are not tracked."""

    def remove(self, key: str) -> None:
        """Nothing is tracked, so nothing to forget."""

    def contains(self, key: str) -> bool:
        """Unknown here, so the store asks the tier itself."""
        return False

    def note_impact(self, key: str, impact: float) -> None:
        """Impact weighs nothing here."""
