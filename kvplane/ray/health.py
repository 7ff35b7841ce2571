"""What the stores and shards tell /metrics about faults: per-tier events, tiers down, shard restarts."""
import asyncio
from dataclasses import dataclass, field

from kvplane.ray.location_index import launch_location_index
from kvplane.ray.namespace import named_actors
from kvplane.ray.shard import SHARD_NAME_PREFIX
from kvplane.stats import StoreStats

TIER_EVENTS = (
    "corruptions", "errors", "skipped", "vanished", "rejections", "evictions", "compressed", "uncompressible",
    "codec_refused",
)
HEALTH_TIMEOUT_S = 1.0  # per scrape: a hung shard or index delays /metrics by this, not forever


def tier_events(stats: StoreStats) -> dict[str, dict[str, float]]:
    """Per tier: the fault counters, `down` (1 while the tier is skipped) and the store's dropped write-backs."""
    events = {
        tier: {**{event: float(getattr(counters, event)) for event in TIER_EVENTS}, "down": float(tier in stats.down)}
        for tier, counters in stats.tiers.items()
    }
    events["*"] = {
        "write_back_dropped": float(stats.write_back_dropped),
        "write_back_errors": float(stats.write_back_errors),
    }
    return events


@dataclass(frozen=True, slots=True)
class ShardHealth:
    """One registered shard as a scrape finds it; `up` is false when it did not answer in time."""

    up: bool
    identity: str = ""
    restarted: bool = False
    recovered: int = 0
    uptime_s: float = 0.0
    events: dict[str, dict[str, float]] = field(default_factory=dict)


async def shard_health(timeout_s: float = HEALTH_TIMEOUT_S) -> dict[str, ShardHealth]:
    """Every registered shard's health, asked concurrently; a hung or dead one reads as down."""
    try:
        shards = named_actors(SHARD_NAME_PREFIX)
    except Exception:  # the registry itself did not answer: no shard series this scrape
        return {}

    async def ask(shard: object) -> ShardHealth:
        try:
            described, stats = await asyncio.wait_for(
                asyncio.gather(shard.describe.remote(), shard.stats.remote()), timeout_s
            )
        except Exception:  # dead, restarting or hung: the metric says so
            return ShardHealth(up=False)
        return ShardHealth(
            up=True, identity=str(described["identity"]), restarted=bool(described["restarted"]),
            recovered=int(described["recovered"]), uptime_s=float(described["uptime_s"]), events=tier_events(stats),
        )

    found = await asyncio.gather(*(ask(shard) for shard in shards.values()))
    return dict(zip(shards, found))


async def index_health(timeout_s: float = HEALTH_TIMEOUT_S) -> dict[str, float]:
    """The location index's restarts, uptime and size; empty when it does not answer in time."""
    try:
        return await asyncio.wait_for(launch_location_index().describe.remote(), timeout_s)
    except Exception:
        return {}
