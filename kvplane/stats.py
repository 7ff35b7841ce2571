"""Counters a store keeps per tier."""
from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class TierStats:
    """Lookups and traffic of one tier. Promotions and demotions count at the receiving tier."""

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    evictions: int = 0
    rejections: int = 0
    promotions: int = 0
    demotions: int = 0
    corruptions: int = 0
    errors: int = 0
    skipped: int = 0  # calls not made while the tier was down after failures
    vanished: int = 0  # entries the policy held that the tier had lost (deleted behind the store's back)
    compressed: int = 0  # entries this tier compressed on the way in
    uncompressible: int = 0  # entries its compression could not represent, kept uncompressed
    codec_refused: int = 0  # entries kept uncompressed because the model's verdict refuses (or lacks) the compression

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (0 before any lookup)."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


@dataclass(slots=True)
class StoreStats:
    """Per-tier counters in tier order, plus failed background writes."""

    tiers: dict[str, TierStats] = field(default_factory=dict)
    write_back_errors: int = 0
    write_back_dropped: int = 0  # background writes not queued because the queue was at its bound
    down: tuple[str, ...] = ()  # tiers being skipped now after failures

    def as_dict(self) -> dict[str, object]:
        """Plain nested dict (for JSON and metrics)."""
        tiers = {name: {**asdict(stats), "hit_rate": stats.hit_rate} for name, stats in self.tiers.items()}
        return {
            "tiers": tiers,
            "write_back_errors": self.write_back_errors,
            "write_back_dropped": self.write_back_dropped,
            "down": list(self.down),
        }
