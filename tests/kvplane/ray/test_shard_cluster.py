"""Node shards on a real two-node Ray cluster: cross-node reads, the location index, shard loss."""
from collections.abc import Iterator

import pytest
import ray
import torch
from ray.actor import ActorHandle
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kvplane.entry import KVEntry
from kvplane.ray.location_index import INDEX_ACTOR_NAME, launch_location_index
from kvplane.ray.namespace import RAY_NAMESPACE
from kvplane.ray.shard import ShardConfig, launch_shards, shard_name
from kvplane.ray.shard_directory import ShardDirectory
from kvplane.ray.worker_store import open_worker_tiered_store
from tests.kvplane.conftest import FINGERPRINT, EntryFactory


@pytest.fixture(scope="module")
def shards(ray_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ActorHandle]]:
    """A shard on each node (RAM + SSD) and the cluster's location index."""
    ssd_root = tmp_path_factory.mktemp("shard-ssd")
    index = launch_location_index()
    handles = launch_shards(
        ShardConfig(ram_capacity_bytes=4 << 20, ssd_url=f"file://{ssd_root}", ssd_capacity_bytes=64 << 20), index
    )
    yield handles
    for handle in [*handles.values(), index]:
        ray.kill(handle)


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


@ray.remote(num_cpus=0)
def put_as_worker(entry: KVEntry) -> str:
    """A worker on this node stores a chunk it computed; returns the node it ran on."""
    with open_worker_tiered_store(1 << 20, ShardDirectory.discover()) as store:
        store.put(entry)
    return ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0)
def get_as_worker(key: str) -> tuple[str, torch.Tensor | None, str | None]:
    """A fresh worker (empty device tier) looks a chunk up; returns its node, the tensor and the tier."""
    node_id = ray.get_runtime_context().get_node_id()
    with open_worker_tiered_store(1 << 20, ShardDirectory.discover(), local_node_id=node_id) as store:
        stream = store.read_layers(key)
        kv = None if stream is None else torch.stack(list(stream))
        return node_id, kv, None if stream is None else stream.tier


def node_ids() -> list[str]:
    return sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])


def test_a_chunk_put_on_one_node_is_read_on_the_other(shards: dict[str, ActorHandle], make_entry: EntryFactory) -> None:
    first, second = node_ids()
    entry = make_entry(1, num_layers=3, dtype=torch.bfloat16)
    assert ray.get(put_as_worker.options(scheduling_strategy=on_node(first)).remote(entry)) == first
    home, _ = ShardDirectory.discover().home(entry.key)
    labels: dict[str, str | None] = {}
    for reader in (second, first):
        node, kv, tier = ray.get(get_as_worker.options(scheduling_strategy=on_node(reader)).remote(entry.key))
        assert node == reader and torch.equal(kv, entry.kv)
        labels[reader] = tier
    # a stream names the home shard's own tier on the home's node, "remote" on the other
    assert labels == {node: "ram" if home == shard_name(node) else "remote" for node in (first, second)}
    assert sorted(labels.values()) == ["ram", "remote"]
    assert ray.get(shards[home].locate.remote(entry.key)) == "ram"
    ray.get(shards[home].flush.remote())
    index = ray.get_actor(INDEX_ACTOR_NAME, namespace=RAY_NAMESPACE)
    tiers = {loc.tier for loc in ray.get(index.lookup.remote([entry.key]))[entry.key] if loc.holder == home}
    assert tiers == {"ram", "ssd"}


def test_a_batch_reaches_each_home_shard_and_answers_as_one_by_one(
    shards: dict[str, ActorHandle], make_entry: EntryFactory
) -> None:
    first, _ = node_ids()
    directory = ShardDirectory.discover()
    candidates = [make_entry(seed) for seed in range(300, 400)]
    entries = [e for e in candidates if directory.home(e.key)[0] == shard_name(first)][:6]
    entries += [e for e in candidates if directory.home(e.key)[0] != shard_name(first)][:6]
    assert len(entries) == 12  # both shards get a share
    keys = [e.key for e in entries] + [make_entry(999_999).key]
    with open_worker_tiered_store(0, directory, local_node_id=first) as store:  # the shards are its top tier
        store.put_many(entries)
        assert store.contains_many(keys) == [True] * len(entries) + [False]
        local = shard_name(first)
        expected = [["ram" if directory.home(e.key)[0] == local else "remote"] for e in entries] + [[]]
        assert store.tiers_holding_many(keys) == expected == [store.tiers_holding(key) for key in keys]
        assert all(torch.equal(store.get(e.key).kv, e.kv) for e in entries)
        # A request's chunks read in one call per shard, whole: the same layers and serving tiers as one by one.
        streams = store.read_layers_many(keys)
        assert streams[-1] is None
        assert [[stream.tier] for stream in streams[:-1]] == expected[:-1]
        assert all(torch.equal(torch.stack(list(stream)), e.kv) for stream, e in zip(streams, entries))


def test_a_killed_shard_turns_its_keys_into_misses(shards: dict[str, ActorHandle], make_entry: EntryFactory) -> None:
    # Node ids (and so each key's home shard) are new at every Ray start: pick keys that land on both sides.
    victim = shard_name(node_ids()[0])
    directory = ShardDirectory.discover(index=ray.get_actor(INDEX_ACTOR_NAME, namespace=RAY_NAMESPACE))
    candidates = [make_entry(seed) for seed in range(100, 200)]
    lost = [e for e in candidates if directory.home(e.key)[0] == victim][:5]
    kept = [e for e in candidates if directory.home(e.key)[0] != victim][:5]
    assert len(lost) == len(kept) == 5
    with open_worker_tiered_store(1, directory) as writer:
        for entry in [*lost, *kept]:
            writer.put(entry)
    ray.kill(shards[victim], no_restart=True)
    with pytest.raises(RayActorError):  # the kill lands asynchronously; wait until calls fail
        while True:
            ray.get(shards[victim].ping.remote(), timeout=30)

    # A batch written before anything noticed: the dead shard's share moves to its keys' next home.
    candidates = [make_entry(seed) for seed in range(500, 600)]
    batch = [e for e in candidates if directory.home(e.key)[0] == victim][:4]
    batch += [e for e in candidates if directory.home(e.key)[0] != victim][:4]
    assert len(batch) == 8
    with open_worker_tiered_store(0, directory) as writer:
        writer.put_many(batch)
        assert all(torch.equal(writer.get(e.key).kv, e.kv) for e in batch)

    with open_worker_tiered_store(1, directory) as reader:
        assert all(reader.get(e.key) is None for e in lost)
        assert all(torch.equal(reader.get(e.key).kv, e.kv) for e in kept)
        assert victim not in directory.live()
        newcomer = make_entry(999)
        reader.put(newcomer)
        reader.flush()
    survivor = next(iter(directory.live().values()))
    assert ray.get(survivor.contains.remote(newcomer.key))
    directory.refresh()
    assert set(directory.live()) == set(shards) - {victim}
    assert directory.invalidate(FINGERPRINT) >= len(kept) + 1
    with open_worker_tiered_store(1, directory) as reader:
        assert all(reader.get(e.key) is None for e in [*kept, newcomer, *batch])
    index = ray.get_actor(INDEX_ACTOR_NAME, namespace=RAY_NAMESPACE)
    holders = {loc.holder for locs in ray.get(index.lookup.remote([e.key for e in lost])).values() for loc in locs}
    assert victim not in holders
