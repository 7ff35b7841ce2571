"""KVShard: one node's RAM and SSD tiers, served to the cluster through Ray."""
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kvplane.buffers import owned_blob
from kvplane.compression.registry import NONE, compression
from kvplane.compression.verdicts import VerdictBook, VerdictGate
from kvplane.eviction.slot_share import slot_share_bytes
from kvplane.node_identity import NodeSlot, claim_slot, live_slots
from kvplane.ray.index_reporter import IndexReporter
from kvplane.ray.index_watch import IndexWatch
from kvplane.ray.namespace import RAY_NAMESPACE, was_restarted
from kvplane.stats import StoreStats
from kvplane.store import STALE_TEMPORARY_S, TieredStore
from kvplane.tiers.spec import TierSpec

SHARD_NAME_PREFIX = "kvshard-"
SSD_TIER = "ssd"
SHARE_REFRESH_S = 5.0  # a slot that comes or goes changes the others' shares within this long

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class ShardConfig:
    """Capacities of a node's shard; the SSD tier lives under `ssd_url/<stable node identity>`."""

    # ssd_capacity_bytes is the node's SSD budget under a local root, shared by the live shards there.

    ram_capacity_bytes: int
    ssd_url: str | None = None
    ssd_capacity_bytes: int = 0
    policy: str = "tinylfu"
    write_back_threads: int = 1
    tenant_share: float = 1.0  # of each tier, for one tenant while others hold entries there
    ram_compression: str = NONE
    ssd_compression: str = NONE
    verdicts_url: str | None = None  # where the models' compression verdicts are recorded (None: no gate)
    verdicts_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ram_capacity_bytes < 0 or self.ssd_capacity_bytes < 0:
            raise ValueError("capacities must be >= 0")
        for name in (self.ram_compression, self.ssd_compression):
            compression(name)  # a ValueError naming the known ones
        if self.ssd_url is not None and "://" not in self.ssd_url:
            raise ValueError(f"ssd_url needs a scheme such as file://, got {self.ssd_url!r}")
        if not 0.0 < self.tenant_share <= 1.0:
            raise ValueError(f"tenant_share must be in (0, 1], got {self.tenant_share}")

    def tier_specs(self, identity: str) -> list[TierSpec]:
        """The shard's tiers on the node known as `identity`, fastest first."""
        specs = [TierSpec("ram", "ram://", self.ram_capacity_bytes, self.policy, compression=self.ram_compression)]
        if self.ssd_url is not None:
            url = f"{self.ssd_url.rstrip('/')}/{identity}"
            ssd = TierSpec(SSD_TIER, url, self.ssd_capacity_bytes, self.policy, compression=self.ssd_compression)
            specs.append(ssd)
        return specs

    @property
    def local_ssd_root(self) -> Path | None:
        """The SSD folder's parent on this machine, when the SSD tier is a local directory."""
        if self.ssd_url is None or not self.ssd_url.startswith("file://"):
            return None
        return Path(self.ssd_url.removeprefix("file://"))


def shard_name(node_id: str) -> str:
    """Actor name of the shard on `node_id`."""
    return f"{SHARD_NAME_PREFIX}{node_id}"


class ShardServer:
    """A node's TieredStore answering the Tier calls with numpy blobs (zero-copy through Ray)."""

    # The SSD folder is named by a stable identity (a slot of this node, see node_identity), not by the
    # Ray node id, which is new at every Ray start: a restarted node, shard or pod finds its entries again.
    # Holding the slot alone, the shard sweeps every temporary file of an interrupted write at start.

    def __init__(self, config: ShardConfig, node_id: str, index: ActorHandle | None = None) -> None:
        self.name = shard_name(node_id)
        root = config.local_ssd_root
        self._slot: NodeSlot | None = None if root is None else claim_slot(root)
        # Without a local SSD nothing outlives the process, so the actor's name serves as its identity.
        self.identity = self.name if self._slot is None else self._slot.name
        self._reporter = IndexReporter(index, self.name) if index is not None else None
        specs = config.tier_specs(self.identity)
        capped = () if self._slot is None else (SSD_TIER,)
        self._store = TieredStore.from_specs(
            specs,
            write_back_threads=config.write_back_threads,
            listener=self._reporter,
            tenant_share=config.tenant_share,
            capped_tiers=capped,
            gate=None if config.verdicts_url is None else VerdictGate(VerdictBook(config.verdicts_url,
                                                                                  config.verdicts_options)),
        )
        self._ssd_budget_bytes = config.ssd_capacity_bytes
        self._ssd_share_bytes = config.ssd_capacity_bytes
        self._share_lock = threading.Lock()
        self.refresh_share()  # before recovery, which then adopts only what fits in this slot's share
        self.recovered = self._store.recover(0.0 if self._slot is not None else STALE_TEMPORARY_S)
        # An index that restarts comes back empty; the shard's entries are most of what it should know.
        self._watch = None if index is None else IndexWatch(index, self._store, self._reporter).start()
        self._share_watch = None if self._slot is None else ShareWatch(self).start()
        self.restarted = was_restarted()
        self._started_s = time.monotonic()
        how = "restarted" if self.restarted else "started"
        _log.warning("kvplane: shard %s %s as %s; %d entries recovered", self.name, how, self.identity, self.recovered)

    def refresh_share(self) -> int | None:
        """Count the live slots under the SSD root and hold this shard to its share of the node's SSD budget."""
        # One budget per node: each live slot under the root holds budget // live slots, recounted each refresh.
        if self._slot is None:
            return None
        with self._share_lock:
            share_bytes = slot_share_bytes(self._ssd_budget_bytes, len(live_slots(self._slot.root)))
            if share_bytes != self._ssd_share_bytes:
                evicted = self._store.cap_tier(SSD_TIER, share_bytes)
                _log.warning("kvplane: shard %s may hold %d SSD bytes of the node's %d now (%d entries evicted)",
                             self.identity, share_bytes, self._ssd_budget_bytes, evicted)
                self._ssd_share_bytes = share_bytes
            return share_bytes

    def close(self) -> None:
        """Stop the background work, finish pending writes and give the SSD slot up."""
        if self._share_watch is not None:
            self._share_watch.stop()
        if self._watch is not None:
            self._watch.stop()
        self._store.close()
        if self._slot is not None:
            self._slot.release()

    def ping(self) -> str:
        """The shard's name, once it is up."""
        return self.name

    def describe(self) -> dict[str, object]:
        """Identity and health: stable identity, process, whether Ray restarted it, entries recovered, uptime."""
        return {
            "identity": self.identity,
            "pid": os.getpid(),
            "restarted": self.restarted,
            "recovered": self.recovered,
            "uptime_s": time.monotonic() - self._started_s,
        }

    def put(self, key: str, blob: np.ndarray) -> None:
        """Store an encoded chunk (copied out of the read-only object-store view into the shard's memory)."""
        self._store.put_blob(key, owned_blob(blob))

    def put_many(self, keys: list[str], blobs: list[np.ndarray]) -> None:
        """Store several encoded chunks: one call and one object-store transfer for the lot."""
        for key, blob in zip(keys, blobs, strict=True):
            self.put(key, blob)

    def read(self, key: str, start: int = 0, end: int | None = None) -> np.ndarray | None:
        """Encoded bytes `[start, end)` of `key`, or None."""
        data = self._store.read(key, start, end)
        return None if data is None else data.numpy()

    def read_located(self, key: str) -> tuple[str, np.ndarray] | None:
        """The whole encoded chunk and the tier of this shard it was found in, or None."""
        tier = self._store.locate(key)
        data = self._store.read(key) if tier is not None else None
        return None if data is None else (tier, data.numpy())

    def read_located_many(self, keys: list[str]) -> list[tuple[str, np.ndarray] | None]:
        """`read_located` of each key: a request's chunks in one call."""
        return [self.read_located(key) for key in keys]

    def delete(self, key: str) -> None:
        """Remove `key` from this shard."""
        self._store.delete(key)

    def contains(self, key: str) -> bool:
        """Whether this shard holds `key`."""
        return self._store.contains(key)

    def locate(self, key: str) -> str | None:
        """Which of this shard's tiers holds `key`."""
        return self._store.locate(key)

    def contains_many(self, keys: list[str]) -> list[bool]:
        """Whether this shard holds each key."""
        return [self._store.contains(key) for key in keys]

    def locate_many(self, keys: list[str]) -> list[str | None]:
        """Which of this shard's tiers holds each key."""
        return [self._store.locate(key) for key in keys]

    def scan(self, prefix: str = "") -> list[tuple[str, int]]:
        """Keys held here that start with `prefix`, with sizes."""
        return list(self._store.scan(prefix))

    def invalidate(self, fingerprint: str) -> int:
        """Remove this shard's chunks of `fingerprint`."""
        return self._store.invalidate(fingerprint)

    def stats(self) -> StoreStats:
        """This shard's store counters."""
        return self._store.stats()

    def flush(self) -> None:
        """Finish background writes and send pending index events."""
        self._store.flush()
        if self._reporter is not None:
            self._reporter.flush()


class ShareWatch:
    """Refreshes a shard's share of its node's SSD budget now and then, as slots come and go."""

    def __init__(self, shard: ShardServer, interval_s: float = SHARE_REFRESH_S) -> None:
        self._shard = shard
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvplane-share-watch", daemon=True)

    def start(self) -> "ShareWatch":
        """Start refreshing in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop refreshing."""
        self._stopped.set()

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self._shard.refresh_share()
            except OSError as err:  # the root is unreachable for now: the next refresh tries again
                _log.warning("kvplane: could not count the SSD slots of shard %s: %s", self._shard.identity, err)


@ray.remote(num_cpus=0, max_concurrency=8, max_restarts=-1)
class KVShard(ShardServer):
    """Ray actor shell over ShardServer: one per node, named `kvshard-<node id>`; Ray restarts it if it dies."""


def launch_shards(config: ShardConfig, index: ActorHandle | None = None) -> dict[str, ActorHandle]:
    """Start (or find) a KVShard pinned to every alive node; returns them by name once all answer."""
    shards = {}
    for node_id in _alive_node_ids():
        shards[shard_name(node_id)] = KVShard.options(
            name=shard_name(node_id),
            namespace=RAY_NAMESPACE,
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(config, node_id, index)
    ray.get([shard.ping.remote() for shard in shards.values()])
    return shards


def ensure_local_shard(config: ShardConfig, index: ActorHandle | None = None) -> ActorHandle:
    """The KVShard of the node this process runs on, started (detached, outliving its starter) if absent."""
    node_id = ray.get_runtime_context().get_node_id()
    shard = KVShard.options(
        name=shard_name(node_id),
        namespace=RAY_NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(config, node_id, index)
    ray.get(shard.ping.remote())
    return shard


def _alive_node_ids() -> Iterator[str]:
    return (node["NodeID"] for node in ray.nodes() if node["Alive"])
