"""TieredStore over real RAM and local-disk tiers: placement, movement, damage, invalidation."""
from pathlib import Path

import pytest
import torch

from kvplane.codec import encode
from kvplane.keys import key_path
from kvplane.layer_stream import ChunkLost
from kvplane.store import TieredStore
from kvplane.tiers.memory import MemoryTier
from kvplane.tiers.spec import TierSpec, open_tier
from kvplane.tiers.tier import TierError
from tests.kvplane.conftest import FINGERPRINT, EntryFactory


def blob_bytes(make_entry: EntryFactory) -> int:
    return encode(make_entry(0)).numel()


def ram_ssd_store(ssd_url: str, ram_entries: int, entry_bytes: int, policy: str = "lru") -> TieredStore:
    return TieredStore.from_specs(
        [
            TierSpec("ram", "ram://", ram_entries * entry_bytes, policy),
            TierSpec("ssd", ssd_url, 1000 * entry_bytes, policy),
        ]
    )


def ssd_file(ssd_url: str, key: str) -> Path:
    return Path(ssd_url.removeprefix("file://")) / key_path(key)


def test_put_get_round_trip_and_write_back(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(1, dtype=torch.bfloat16)
    with ram_ssd_store(ssd_url, 4, blob_bytes(make_entry)) as store:
        store.put(entry)
        store.flush()
        got = store.get(entry.key)
        assert got is not None and torch.equal(got.kv, entry.kv) and got.token_ids == entry.token_ids
        assert store.locate(entry.key) == "ram"
        assert ssd_file(ssd_url, entry.key).exists()
        assert store.stats().tiers["ram"].hits == 1
    assert store.get(make_entry(2).key) is None


def test_returned_tensors_do_not_alias_the_cache(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(3)
    with ram_ssd_store(ssd_url, 4, blob_bytes(make_entry)) as store:
        store.put(entry)
        store.get(entry.key).kv.zero_()
        assert torch.equal(store.get(entry.key).kv, entry.kv)


def test_eviction_demotes_and_a_lower_hit_promotes(make_entry: EntryFactory) -> None:
    entries = [make_entry(seed) for seed in range(6)]
    size = blob_bytes(make_entry)
    lower = MemoryTier("cxl", 2 * size)
    with TieredStore([MemoryTier("ram", 2 * size), lower], "lru") as store:
        store.put(entries[0])
        for entry in entries[1:4]:
            # entry 0 stays hot in RAM while write-backs of newer entries age it out of the lower tier
            store.put(entry)
            store.flush()
            assert store.get(entries[0].key) is not None
        assert store.locate(entries[0].key) == "ram" and not lower.contains(entries[0].key)
        for entry in entries[4:]:
            store.put(entry)
            store.flush()
        # evicted from RAM, entry 0 moved down instead of being dropped
        assert store.locate(entries[0].key) == "cxl"
        assert store.stats().tiers["cxl"].demotions == 1
        assert torch.equal(store.get(entries[0].key).kv, entries[0].kv)
        store.flush()
        assert store.locate(entries[0].key) == "ram"
        assert store.stats().tiers["ram"].promotions == 1


def test_evicted_entries_stay_reachable_below(make_entry: EntryFactory, ssd_url: str) -> None:
    entries = [make_entry(seed) for seed in range(8)]
    with ram_ssd_store(ssd_url, 2, blob_bytes(make_entry)) as store:
        for entry in entries:
            store.put(entry)
        store.flush()
        assert [store.locate(e.key) for e in entries].count("ram") == 2
        assert all(torch.equal(store.get(e.key).kv, e.kv) for e in entries)


def test_corrupt_entry_is_a_miss_and_is_deleted(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(4)
    with TieredStore.from_specs([TierSpec("ssd", ssd_url, 1 << 20)]) as store:
        store.put(entry)
        path = ssd_file(ssd_url, entry.key)
        data = bytearray(path.read_bytes())
        data[-5] ^= 0x40
        path.write_bytes(bytes(data))
        assert store.get(entry.key) is None
        assert not path.exists()
        assert store.stats().tiers["ssd"].corruptions == 1


def test_corrupt_upper_copy_falls_through_to_a_sound_lower_copy(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(5)
    with ram_ssd_store(ssd_url, 4, blob_bytes(make_entry)) as store:
        store.put(entry)
        store.flush()
        path = ssd_file(ssd_url, entry.key)
        store.delete(entry.key)
        store.put(entry)
        store.flush()
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(bytes(data))
        stream = store.read_layers(entry.key)
        assert stream is not None and stream.tier == "ram"
        assert torch.equal(torch.stack(list(stream)), entry.kv)


def test_read_layers_yields_each_layer_in_order(make_entry: EntryFactory, ssd_url: str) -> None:
    entry, newer = make_entry(6, num_layers=5, dtype=torch.float16), make_entry(60, num_layers=5, dtype=torch.float16)
    with ram_ssd_store(ssd_url, 1, encode(entry).numel()) as store:
        assert store.read_layers(entry.key) is None
        store.put(entry)
        store.put(newer)
        store.flush()
        stream = store.read_layers(entry.key)
        assert stream.tier == "ssd" and stream.token_ids == entry.token_ids and stream.num_layers == 5
        layers = list(stream)
        assert [tuple(layer.shape) for layer in layers] == [(2, 8, 3, 8)] * 5
        assert torch.equal(torch.stack(layers), entry.kv)
        store.flush()
        assert store.locate(entry.key) == "ram"
        assert torch.equal(store.get(entry.key).kv, entry.kv)


def test_read_layers_from_a_chosen_tier(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(7, num_layers=3, dtype=torch.float16)
    with ram_ssd_store(ssd_url, 4, encode(entry).numel()) as store:
        store.put(entry)
        store.flush()
        assert store.tiers_holding(entry.key) == ["ram", "ssd"]
        assert store.read_layers(entry.key).tier == "ram"
        from_ssd = store.read_layers(entry.key, "ssd")
        assert from_ssd.tier == "ssd" and torch.equal(torch.stack(list(from_ssd)), entry.kv)
        assert store.read_layers(entry.key, "no-such-tier").tier == "ram"
        ssd_file(ssd_url, entry.key).unlink()  # the chosen tier lost it: read from the tier that still holds it
        assert store.read_layers(entry.key, "ssd").tier == "ram"  # gone from the chosen tier: found above it


def test_layer_damaged_mid_stream_raises_chunk_lost(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(7, num_layers=3)
    with TieredStore.from_specs([TierSpec("ssd", ssd_url, 1 << 20)]) as store:
        store.put(entry)
        stream = store.read_layers(entry.key)
        layers = iter(stream)
        assert torch.equal(next(layers), entry.kv[0])
        path = ssd_file(ssd_url, entry.key)
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(bytes(data))
        assert torch.equal(next(layers), entry.kv[1])
        with pytest.raises(ChunkLost):
            next(layers)
        assert not store.contains(entry.key)


def test_invalidate_removes_a_fingerprint_from_every_tier(make_entry: EntryFactory, ssd_url: str) -> None:
    stale = [make_entry(seed) for seed in range(3)]
    fresh = make_entry(9, fingerprint="retrained-weights")
    with ram_ssd_store(ssd_url, 2, blob_bytes(make_entry)) as store:
        for entry in [*stale, fresh]:
            store.put(entry)
        assert store.invalidate(FINGERPRINT) == 3
        assert all(store.locate(e.key) is None for e in stale)
        assert store.get(fresh.key) is not None


def test_recover_adopts_what_a_previous_store_left_on_disk(make_entry: EntryFactory, ssd_url: str) -> None:
    entries = [make_entry(seed) for seed in range(3)]
    with ram_ssd_store(ssd_url, 2, blob_bytes(make_entry)) as store:
        for entry in entries:
            store.put(entry)
    with ram_ssd_store(ssd_url, 2, blob_bytes(make_entry)) as restarted:
        assert restarted.recover() == 3
        assert all(restarted.locate(e.key) == "ssd" for e in entries)
        assert restarted.get(entries[0].key) is not None


class FailingTier(MemoryTier):
    """A tier whose backend is down."""

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        raise TierError("backend unreachable")

    def put(self, key: str, blob: torch.Tensor) -> None:
        raise TierError("backend unreachable")


def test_a_failing_tier_is_a_miss_not_a_crash(make_entry: EntryFactory) -> None:
    entry = make_entry(10)
    with TieredStore([FailingTier("remote", 1 << 20), MemoryTier("ram", 1 << 20)], "lru") as store:
        store.put(entry)
        store.flush()
        assert store.get(entry.key) is not None
        assert store.stats().tiers["remote"].errors >= 2


def test_listener_hears_placements_and_removals(make_entry: EntryFactory) -> None:
    events: list[tuple[str, str, int]] = []
    entry = make_entry(11)
    with TieredStore([MemoryTier("ram", 1 << 20)], "lru", listener=lambda *event: events.append(event)) as store:
        store.put(entry)
        store.delete(entry.key)
    assert events == [(entry.key, "ram", encode(entry).numel()), (entry.key, "ram", 0)]


class RoundTripTier(MemoryTier):
    """A tier where each read costs a round trip (as a shard actor's or an object store's): reads are counted."""

    reads_whole = True

    def __init__(self, name: str, capacity_bytes: int) -> None:
        super().__init__(name, capacity_bytes)
        self.reads: list[tuple[int, int | None]] = []
        self.damaged = False  # flip the last byte of every multi-layer read: its last layer fails its checksum

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        self.reads.append((start, end))
        data = super().read(key, start, end)
        if data is not None and self.damaged and start > 0:
            data[-1] ^= 1
        return data


def test_a_round_trip_tier_streams_every_layer_from_one_read(make_entry: EntryFactory) -> None:
    entry = make_entry(12, num_layers=6, dtype=torch.float16)
    remote = RoundTripTier("remote", 1 << 22)
    with TieredStore([remote], "lru") as store:
        store.put(entry)
        store.flush()
        remote.reads.clear()
        stream = store.read_layers(entry.key)
        assert torch.equal(torch.stack(list(stream)), entry.kv)
    data_reads = [read for read in remote.reads if read[0] > 0]
    assert len(data_reads) == 1  # the header probe, then every layer in one read (not six)


def test_a_damaged_whole_read_falls_back_to_a_sound_copy_below(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(13, num_layers=4, dtype=torch.float16)
    remote = RoundTripTier("remote", 1 << 22)
    with TieredStore([remote, open_tier(TierSpec("ssd", ssd_url, 1 << 22))], "lru") as store:
        store.put(entry)
        store.flush()
        remote.damaged = True
        assert torch.equal(torch.stack(list(store.read_layers(entry.key))), entry.kv)
