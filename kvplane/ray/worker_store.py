"""The store a worker process holds: its device tier over its cluster's shards and the object store."""
from kvplane.compression.registry import NONE
from kvplane.compression.verdicts import CompressionGate
from kvplane.level import PlacementListener
from kvplane.ray.shard_directory import ShardDirectory
from kvplane.ray.shard_tier import ShardTier
from kvplane.store import TieredStore
from kvplane.tiers.spec import TierSpec, open_tier
from kvplane.tiers.tier import Tier


def open_worker_tiered_store(  # noqa: PLR0913 - keywords past the capacity and the shards, each a store setting
    device_capacity_bytes: int,
    directory: ShardDirectory | None = None,
    *,
    object_store: TierSpec | None = None,
    policy: str = "tinylfu",
    listener: PlacementListener | None = None,
    write_back_threads: int = 2,
    local_node_id: str | None = None,
    tenant_share: float = 1.0,
    device_compression: str = NONE,
    gate: CompressionGate | None = None,
) -> TieredStore:
    """A worker's store: `device` (HBM, or host memory; skipped at capacity 0), then the shards and objects."""
    # The shards compress as their own tiers are configured, so the tier over them passes blobs as they are.
    tiers: list[Tier] = []
    policies: list[str] = []
    compressions: list[str] = []
    if device_capacity_bytes > 0:
        tiers.append(open_tier(TierSpec("device", "device://", device_capacity_bytes, policy)))
        policies.append(policy)
        compressions.append(device_compression)
    if directory is not None:
        tiers.append(ShardTier(directory, local_node_id=local_node_id))
        policies.append("passthrough")
        compressions.append(NONE)
    if object_store is not None:
        tiers.append(open_tier(object_store))
        policies.append(object_store.policy)
        compressions.append(object_store.compression)
    if not tiers:
        raise ValueError("a worker store needs a device tier, the shards or an object store")
    return TieredStore(
        tiers,
        policies,
        write_back_threads=write_back_threads,
        listener=listener,
        tenant_share=tenant_share,
        compressions=compressions,
        gate=gate,
    )
