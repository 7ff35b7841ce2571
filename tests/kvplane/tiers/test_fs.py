"""File and object-store tiers: atomic local writes, and a real S3 endpoint (moto server)."""
from pathlib import Path

import fsspec
import pytest
import torch

from kvplane.keys import chunk_key, key_path
from kvplane.store import TieredStore
from kvplane.tiers.fs import FsspecTier, LocalFileTier
from kvplane.tiers.spec import TierSpec, open_tier
from kvplane.tiers.tier import TierError
from tests.kvplane.conftest import EntryFactory

KEY = chunk_key("fp", "tenant", [1, 2, 3])


def test_local_tier_reads_whole_blobs_and_ranges(tmp_path: Path) -> None:
    tier = open_tier(TierSpec("ssd", f"file://{tmp_path}", 1 << 20))
    assert isinstance(tier, LocalFileTier)
    blob = torch.arange(200, dtype=torch.uint8)
    tier.put(KEY, blob)
    assert torch.equal(tier.read(KEY), blob)
    assert torch.equal(tier.read(KEY, 50, 60), blob[50:60])
    assert tier.read(KEY, 190, 400).numel() == 10
    assert tier.read(chunk_key("fp", "tenant", [4])) is None
    assert list(tier.scan()) == [(KEY, 200)]


def test_a_write_cut_short_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = LocalFileTier("ssd", 1 << 20, f"file://{tmp_path}")
    old = torch.full((64,), 7, dtype=torch.uint8)
    tier.put(KEY, old)

    def crash(*_args: object, **_kwargs: object) -> None:
        raise OSError("process killed before rename")

    monkeypatch.setattr(tier._fs, "mv", crash)
    with pytest.raises(TierError):
        tier.put(KEY, torch.zeros(128, dtype=torch.uint8))
    leftovers = [p.name for p in (tmp_path / key_path(KEY)).parent.iterdir()]
    assert any(".tmp-" in name for name in leftovers)
    assert torch.equal(tier.read(KEY), old)
    assert list(tier.scan()) == [(KEY, 64)]


def test_s3_tier_round_trip_on_a_real_endpoint(s3_spec: TierSpec) -> None:
    tier = open_tier(s3_spec)
    assert isinstance(tier, FsspecTier) and not isinstance(tier, LocalFileTier)
    blob = torch.randint(0, 255, (5000,), dtype=torch.uint8)
    assert not tier.contains(KEY) and tier.read(KEY) is None
    tier.put(KEY, blob)
    assert tier.contains(KEY)
    assert torch.equal(tier.read(KEY), blob)
    assert torch.equal(tier.read(KEY, 1000, 1100), blob[1000:1100])
    assert list(tier.scan(KEY[:17])) == [(KEY, 5000)]
    assert list(tier.scan(chunk_key("other", "tenant", [1])[:17])) == []
    tier.delete(KEY)
    tier.delete(KEY)
    assert not tier.contains(KEY)


def test_store_streams_layers_from_s3_after_a_restart(make_entry: EntryFactory, s3_spec: TierSpec) -> None:
    entry = make_entry(1, num_layers=4, dtype=torch.bfloat16)
    specs = [TierSpec("ram", "ram://", 1 << 20), s3_spec]
    with TieredStore.from_specs(specs) as store:
        store.put(entry, priority=3.0)
    with TieredStore.from_specs(specs) as restarted:
        assert restarted.locate(entry.key) == "s3"
        stream = restarted.read_layers(entry.key)
        assert stream.tier == "s3" and stream.header.priority == 3.0
        assert torch.equal(torch.stack(list(stream)), entry.kv)
        restarted.flush()
        assert restarted.locate(entry.key) == "ram"
        assert restarted.invalidate(entry.fingerprint) == 1
        assert restarted.get(entry.key) is None


def test_corrupt_s3_object_is_a_miss_and_is_deleted(make_entry: EntryFactory, s3_spec: TierSpec) -> None:
    entry = make_entry(2)
    with TieredStore.from_specs([s3_spec]) as store:
        store.put(entry)
        fs, root = fsspec.core.url_to_fs(s3_spec.url, **s3_spec.storage_options)
        path = f"{root}/{key_path(entry.key)}"
        damaged = bytearray(fs.cat_file(path))
        damaged[len(damaged) // 2] ^= 0xFF
        fs.pipe_file(path, bytes(damaged))
        assert store.get(entry.key) is None
        assert not fs.exists(path)
        assert store.stats().tiers["s3"].corruptions == 1


def test_unreachable_s3_is_a_miss(make_entry: EntryFactory) -> None:
    options = {"key": "x", "secret": "x", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}, "retries": 1}
    entry = make_entry(3)
    with TieredStore.from_specs([TierSpec("s3", "s3://kvcache/down", 1 << 20, "lru", options)]) as store:
        store.put(entry)
        assert store.get(entry.key) is None
        assert store.stats().tiers["s3"].errors >= 2
