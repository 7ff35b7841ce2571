"""kvplane's faults in /metrics: events per holder and tier, tiers down, node shards' restarts, the location index."""
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge

from kvplane.ray.health import index_health, shard_health


class KVMetrics:
    """Gauges set at each scrape from the workers' heartbeats and from asking the shards and the index."""

    def __init__(self, registry: CollectorRegistry, compressions: Mapping[str, str] | None = None) -> None:
        r = registry
        self._compressions = dict(compressions or {})  # each tier's configured compression
        self.events = Gauge(
            "blendserve_kv_events", "kvplane events so far per holder (worker or node shard) and tier: corruptions, "
            "errors, skipped (calls not made while the tier was down), vanished (entries lost behind the store's "
            "back), rejections, evictions; tier '*': write_back_dropped, write_back_errors",
            ["holder", "tier", "event"], registry=r,
        )
        self.down = Gauge("blendserve_kv_tier_down", "1 while a holder skips a tier after failures", ["holder", "tier"],
                          registry=r)
        self.shard_up = Gauge("blendserve_kv_shard_up", "1 when a registered node shard answered this scrape",
                              ["holder"], registry=r)
        self.shard_restarted = Gauge(
            "blendserve_kv_shard_restarted", "1 when Ray brought the node shard back after it died",
            ["holder", "identity"], registry=r,
        )
        self.shard_recovered = Gauge(
            "blendserve_kv_shard_recovered_entries", "Entries a node shard found on its SSD when it started",
            ["holder"], registry=r,
        )
        self.shard_uptime = Gauge("blendserve_kv_shard_uptime_seconds", "Seconds since the node shard started",
                                  ["holder"], registry=r)
        self.codec_refused = Gauge(
            "blendserve_kv_codec_refused", "Chunks each tier kept uncompressed so far because the model's recorded "
            "verdict refuses (or has not yet allowed) the tier's configured compression, summed over holders",
            ["codec", "tier"], registry=r,
        )
        self.index = Gauge(
            "blendserve_location_index", "The location index: restarted (1: it came back empty), uptime_s, keys",
            ["figure"], registry=r,
        )

    async def scrape(self, worker_events: Mapping[str, Mapping[str, Mapping[str, float]]]) -> None:
        """Replace the gauges with what the workers reported and what the shards and the index answer now."""
        shards = await shard_health()
        index = await index_health()
        for gauge in (self.events, self.down, self.shard_up, self.shard_restarted, self.shard_recovered,
                      self.shard_uptime, self.codec_refused, self.index):
            gauge.clear()
        refused: dict[str, float] = {}
        holders = {**worker_events, **{name: health.events for name, health in shards.items()}}
        for holder, tiers in holders.items():
            for tier, events in tiers.items():
                for event, value in events.items():
                    if event == "down":
                        self.down.labels(holder, tier).set(value)
                    else:
                        self.events.labels(holder, tier, event).set(value)
                    if event == "codec_refused":
                        refused[tier] = refused.get(tier, 0.0) + value
        for tier, value in refused.items():
            self.codec_refused.labels(self._compressions.get(tier, "none"), tier).set(value)
        for name, health in shards.items():
            self.shard_up.labels(name).set(float(health.up))
            if health.up:
                self.shard_restarted.labels(name, health.identity).set(float(health.restarted))
                self.shard_recovered.labels(name).set(health.recovered)
                self.shard_uptime.labels(name).set(health.uptime_s)
        for figure, value in index.items():
            self.index.labels(figure).set(value)
