"""Node shards come back by themselves on a real two-node Ray cluster, and find their SSD entries again."""
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kvplane.entry import KVEntry
from kvplane.ray.location_index import launch_location_index
from kvplane.ray.shard import ShardConfig, launch_shards, shard_name
from kvplane.ray.shard_directory import ShardDirectory
from kvplane.ray.worker_store import open_worker_tiered_store
from tests.kvplane.conftest import build_entry

RECOVERY_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def ssd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recovery-ssd")


@pytest.fixture(scope="module")
def config(ssd_root: Path) -> ShardConfig:
    return ShardConfig(ram_capacity_bytes=4 << 20, ssd_url=f"file://{ssd_root}", ssd_capacity_bytes=64 << 20)


@pytest.fixture(scope="module")
def index(ray_cluster: object) -> Iterator[ActorHandle]:
    yield launch_location_index()


@pytest.fixture(scope="module")
def shards(ray_cluster: object, config: ShardConfig, index: ActorHandle) -> Iterator[dict[str, ActorHandle]]:
    """A shard on each node; held here, since shards live as long as their starter holds them."""
    yield launch_shards(config, index)


@pytest.fixture(scope="module")
def entries(shards: dict[str, ActorHandle], index: ActorHandle) -> list[KVEntry]:
    """Chunks written through a worker store onto both nodes' shards, flushed to their SSDs."""
    written = [build_entry(seed) for seed in range(300, 340)]
    with open_worker_tiered_store(1, ShardDirectory.discover(index)) as writer:
        for entry in written:
            writer.put(entry)
    ray.get([shard.flush.remote() for shard in shards.values()])
    return written


def describe(shard: ActorHandle) -> dict:
    return ray.get(shard.describe.remote(), timeout=30)


def wait_for(check, what: str) -> object:
    deadline_s = time.monotonic() + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline_s:
        try:
            found = check()
        except (RayActorError, GetTimeoutError, ValueError):
            found = None
        if found:
            return found
        time.sleep(0.5)
    raise TimeoutError(f"{what} within {RECOVERY_TIMEOUT_S} s")


def homed_on(name: str, entries: list[KVEntry]) -> list[KVEntry]:
    directory = ShardDirectory.discover()
    return [entry for entry in entries if directory.home(entry.key)[0] == name]


def readable(entries: list[KVEntry]) -> list[str]:
    """The tier each entry is read from by a fresh worker store (empty device tier)."""
    with open_worker_tiered_store(1, ShardDirectory.discover()) as reader:
        found = [reader.get(entry.key) for entry in entries]
    assert all(got is not None and torch.equal(got.kv, entry.kv) for got, entry in zip(found, entries))
    return [got.source for got in found]


def node_of(name: str) -> str:
    return name.removeprefix("kvshard-")


def test_a_shard_whose_process_dies_comes_back_with_its_ssd_entries(entries: list[KVEntry]) -> None:
    victim_name = shard_name(sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])[0])
    victim = ray.get_actor(victim_name, namespace="blendserve")
    before = describe(victim)
    mine = homed_on(victim_name, entries)
    assert mine and not before["restarted"]
    os.kill(before["pid"], signal.SIGKILL)
    after = wait_for(lambda: (d := describe(victim))["pid"] != before["pid"] and d, "the shard restarted")
    assert after["restarted"] and after["identity"] == before["identity"]
    assert after["recovered"] >= len(mine)
    assert set(readable(mine)) == {"ssd"}  # its RAM died with it; its SSD folder is found again


@pytest.mark.slow  # make test's budget; the two restarts by Ray stay in the default run
def test_a_shard_killed_for_good_is_started_again_by_its_nodes_directory(
    entries: list[KVEntry], config: ShardConfig, index: ActorHandle
) -> None:
    victim_name = shard_name(sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])[1])
    mine = homed_on(victim_name, entries)
    ray.kill(ray.get_actor(victim_name, namespace="blendserve"), no_restart=True)
    wait_for(lambda: victim_name not in ShardDirectory.discover().live(), "the killed shard left the registry")

    @ray.remote(num_cpus=0)
    def refresh_on_node() -> list[str]:
        directory = ShardDirectory.discover(index, keep_local=config)
        directory.refresh()
        return sorted(directory.live())

    node = NodeAffinitySchedulingStrategy(node_of(victim_name), soft=False)
    assert victim_name in ray.get(refresh_on_node.options(scheduling_strategy=node).remote())
    assert set(readable(mine)) == {"ssd"}


def test_a_node_that_ray_starts_again_finds_its_ssd_entries(
    ray_cluster, entries: list[KVEntry], config: ShardConfig, index: ActorHandle
) -> None:
    head, worker_node = ray_cluster.list_all_nodes()[:2]
    old_name = shard_name(worker_node.node_id)
    old_identity = describe(ray.get_actor(old_name, namespace="blendserve"))["identity"]
    mine = homed_on(old_name, entries)
    ray_cluster.remove_node(worker_node)
    ray_cluster.add_node(num_cpus=1, object_store_memory=100 * 1024 * 1024)
    ray_cluster.wait_for_nodes()
    new_node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head.node_id)
    assert new_node != worker_node.node_id
    shards = wait_for(lambda: launch_shards(config, index), "shards on the new node")
    assert describe(shards[shard_name(new_node)])["identity"] == old_identity
    wait_for(lambda: old_name not in ShardDirectory.discover().live(), "the old node's shard left the registry")
    assert set(readable(mine)) == {"ssd"}


def test_the_shards_refill_a_location_index_that_restarted_empty(entries: list[KVEntry], index: ActorHandle) -> None:
    keys = [entry.key for entry in entries]

    def holders() -> set[str]:
        return {loc.holder for locs in ray.get(index.lookup.remote(keys), timeout=10).values() for loc in locs}

    wait_for(holders, "placements in the index")
    ray.kill(index, no_restart=False)
    assert wait_for(lambda: ray.get(index.describe.remote(), timeout=5)["restarted"], "the index restarted")
    assert wait_for(lambda: {h for h in holders() if h.startswith("kvshard-")}, "the shards re-reported")
