"""TieredStore's batched calls: one tier call for many keys where the tier takes them, answering as one by one."""
from collections.abc import Sequence

import torch

from kvplane.store import TieredStore
from kvplane.tiers.memory import MemoryTier
from kvplane.tiers.tier import BatchedTier, TierError
from tests.kvplane.conftest import EntryFactory


class BatchedMemoryTier(MemoryTier):
    """A RAM tier with the batched calls of the node shards, each call counted."""

    reads_whole = True  # as a shard's: every read a round trip

    def __init__(self, name: str, capacity_bytes: int, failing: bool = False) -> None:
        super().__init__(name, capacity_bytes)
        self.calls: list[tuple[str, int]] = []
        self.failing = failing

    def put(self, key: str, blob: torch.Tensor) -> None:
        self.calls.append(("put", 1))
        self._put(key, blob)

    def put_many(self, items: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.calls.append(("put_many", len(items)))
        for key, blob in items:
            self._put(key, blob)

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        self.calls.append(("contains_many", len(keys)))
        return [self.contains(key) for key in keys]

    def labels_of(self, keys: Sequence[str]) -> list[str | None]:
        self.calls.append(("labels_of", len(keys)))
        return [self.label_of(key) for key in keys]

    def read_whole_many(self, keys: Sequence[str]) -> list[tuple[torch.Tensor, str] | None]:
        self.calls.append(("read_whole_many", len(keys)))
        return [None if (blob := self.read(key)) is None else (blob, self.name) for key in keys]

    def _put(self, key: str, blob: torch.Tensor) -> None:
        if self.failing:
            raise TierError("backend unreachable")
        super().put(key, blob)


def test_a_batched_tier_gets_a_batch_in_one_call_and_answers_as_one_by_one(make_entry: EntryFactory) -> None:
    shard = BatchedMemoryTier("shard", 1 << 20)
    ssd = MemoryTier("ssd", 1 << 20)
    assert isinstance(shard, BatchedTier) and not isinstance(ssd, BatchedTier)
    entries = [make_entry(seed) for seed in range(4)]
    absent = make_entry(99)
    with TieredStore([shard, ssd], "lru") as store:
        store.put_many(entries)
        store.flush()
        assert shard.calls == [("put_many", 4)]
        assert all(torch.equal(store.get(e.key).kv, e.kv) for e in entries)
        assert all(ssd.contains(e.key) for e in entries)  # written back to the lower tier as a single put is
    keys = [e.key for e in entries] + [absent.key]
    # A store that has not seen the keys asks the tier itself: once for the batch.
    with TieredStore([shard, ssd], "lru") as fresh:
        shard.calls.clear()
        assert fresh.contains_many(keys) == [True] * 4 + [False]
        assert shard.calls == [("contains_many", 5)]
        shard.calls.clear()
        assert fresh.tiers_holding_many(keys) == [["shard", "ssd"]] * 4 + [[]]
        assert shard.calls[0] == ("labels_of", 5)
        assert fresh.contains_many(keys) == [fresh.contains(key) for key in keys]
        assert fresh.tiers_holding_many(keys) == [fresh.tiers_holding(key) for key in keys]


def test_layer_streams_of_many_keys_come_from_one_whole_read_of_a_round_trip_tier(make_entry: EntryFactory) -> None:
    device, shard, ssd = MemoryTier("device", 1 << 20), BatchedMemoryTier("shard", 1 << 20), MemoryTier("ssd", 1 << 20)
    entries = [make_entry(seed) for seed in range(4)]
    absent = make_entry(99)
    with TieredStore([shard, ssd], "lru") as filled:
        filled.put_many(entries)
    # The shard's copy of entry 3 is damaged: its header no longer names its key, so the good copy below serves.
    damaged = shard.read(entries[3].key).clone()
    damaged[40:60] ^= 0xFF
    shard.put(entries[3].key, damaged)
    with TieredStore([device, shard, ssd], "lru") as store:
        store.put(entries[0])  # on the device tier as well
        store.flush()
        shard.calls.clear()
        streams = store.read_layers_many([e.key for e in entries] + [absent.key])
        assert shard.calls == [("read_whole_many", 4)]  # entries 1-3 and the absent one, in one call
        assert streams[4] is None
        assert [stream.tier for stream in streams[:4]] == ["device", "shard", "shard", "ssd"]
        for stream, entry in zip(streams, entries):
            assert stream is not None and torch.equal(torch.stack(list(stream)), entry.kv)
        store.flush()
        assert all(device.contains(e.key) for e in entries)  # read from below, so promoted
        # The damaged copy was counted and replaced by the good one, promoted from below.
        assert store.stats().tiers["shard"].corruptions == 1
        assert torch.equal(shard.read(entries[3].key), ssd.read(entries[3].key))


def test_one_put_goes_through_the_single_call(make_entry: EntryFactory) -> None:
    shard = BatchedMemoryTier("shard", 1 << 20)
    with TieredStore([shard], "lru") as store:
        store.put(make_entry(1))
        store.put_many([make_entry(2)])
    assert shard.calls == [("put", 1), ("put", 1)]


def test_a_failed_batch_stores_none_of_it_and_counts_the_error(make_entry: EntryFactory) -> None:
    shard = BatchedMemoryTier("shard", 1 << 20, failing=True)
    entries = [make_entry(seed) for seed in range(3)]
    with TieredStore([shard], "lru") as store:
        store.put_many(entries)
        assert store.contains_many([e.key for e in entries]) == [False] * 3
        assert store.stats().tiers["shard"].errors == 1
        assert all(store.get(e.key) is None for e in entries)


def test_a_tier_without_batched_calls_takes_a_batch_one_by_one(make_entry: EntryFactory) -> None:
    ram = MemoryTier("ram", 1 << 20)
    entries = [make_entry(seed) for seed in range(3)]
    with TieredStore([ram], "lru") as store:
        store.put_many(entries)
        assert [store.get(e.key) is not None for e in entries] == [True] * 3
        assert store.tiers_holding_many([e.key for e in entries]) == [["ram"]] * 3
        assert store.stats().tiers["ram"].bytes_written == sum(ram.read(e.key).numel() for e in entries)
