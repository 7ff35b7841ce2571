"""Compression per tier in a real RAM + SSD store: what each tier holds, that reads decode it, that keys stay put."""
from pathlib import Path

import pytest
import torch

from kvplane.buffers import owned_blob
from kvplane.codec import decode, encode, read_header
from kvplane.keys import key_path
from kvplane.store import TieredStore
from kvplane.tiers.spec import TierSpec
from tests.kvplane.conftest import EntryFactory

MB = 1 << 20


def _store(ssd_url: str, ram: str = "none", ssd: str = "int8", ram_bytes: int = MB) -> TieredStore:
    return TieredStore.from_specs(
        [TierSpec("ram", "ram://", ram_bytes, "lru", compression=ram), TierSpec("ssd", ssd_url, 64 * MB, "lru",
                                                                               compression=ssd)]
    )


def _ssd_file(ssd_url: str, key: str) -> Path:
    return Path(ssd_url.removeprefix("file://")) / key_path(key)


def _on_disk(ssd_url: str, key: str) -> torch.Tensor:
    return owned_blob(_ssd_file(ssd_url, key).read_bytes())


def test_each_tier_keeps_its_own_compression_under_the_same_key(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(1, num_tokens=64, dtype=torch.bfloat16)
    with _store(ssd_url) as store:
        store.put(entry)
        store.flush()
        sizes = {tier: nbytes for tier, key, nbytes in store.placements() if key == entry.key}
        on_disk = _on_disk(ssd_url, entry.key)
        assert read_header(on_disk).compression == "int8"
        assert sizes["ram"] == encode(entry).numel() and sizes["ssd"] == on_disk.numel() < sizes["ram"]
        assert store.get(entry.key).source == "ram" and torch.equal(store.get(entry.key).kv, entry.kv)
        assert store.stats().tiers["ssd"].compressed == 1


@pytest.mark.parametrize("whole", [True, False])
def test_reads_from_a_compressed_tier_decode_whole_and_by_layer(
    make_entry: EntryFactory, ssd_url: str, whole: bool
) -> None:
    entry = make_entry(2, num_tokens=64)
    with _store(ssd_url) as store:
        store.put(entry)
        store.flush()
        store.delete(entry.key)  # gone everywhere; put it only on the SSD, compressed, through the store's own path
    with _store(ssd_url, ram_bytes=0) as store:
        store.put(entry)
        store.flush()
        expected = decode(encode(entry, compression_name="int8"), entry.key)[1]
        if whole:
            got = store.get(entry.key)
            assert got.source == "ssd" and torch.equal(got.kv, expected)
        else:
            stream = store.read_layers(entry.key)
            assert stream.tier == "ssd"
            assert torch.equal(torch.stack(list(stream)), expected)


def test_a_promoted_compressed_entry_stays_compressed(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(3, num_tokens=64)
    with _store(ssd_url) as store:
        store.put(entry)
        store.flush()
        store.delete(entry.key)
    with _store(ssd_url, ssd="int4", ram_bytes=0) as store:
        store.put(entry)
        store.flush()
    with _store(ssd_url, ssd="none") as store:  # reopened with other settings: the SSD's entries read as written
        assert store.recover() == 1
        first = store.get(entry.key)
        store.flush()
        assert first.source == "ssd"
        second = store.get(entry.key)
        assert second.source == "ram" and torch.equal(second.kv, first.kv)
        sizes = {tier: nbytes for tier, key, nbytes in store.placements() if key == entry.key}
        assert sizes["ram"] == sizes["ssd"] == encode(entry, compression_name="int4").numel()
        assert (first.kv - entry.kv).abs().max() > 0  # lossy, as written, not silently replaced


def test_a_damaged_compressed_entry_is_a_miss_and_deleted(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(4, num_tokens=64)
    with _store(ssd_url, ram_bytes=0) as store:
        store.put(entry)
        store.flush()
        path = _ssd_file(ssd_url, entry.key)
        data = bytearray(path.read_bytes())
        data[-5] ^= 0x40  # in the last layer's scale table
        path.write_bytes(bytes(data))
        assert store.get(entry.key) is None
        assert store.stats().tiers["ssd"].corruptions == 1
        assert not path.exists()


def test_values_a_compression_cannot_hold_are_stored_uncompressed(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(5, num_tokens=16)
    entry.kv[0, 1, 3, 0, 0] = 1e7
    with _store(ssd_url, ram_bytes=0) as store:
        store.put(entry)
        store.flush()
        assert store.stats().tiers["ssd"].uncompressible == 1
        assert torch.equal(store.get(entry.key).kv, entry.kv)


def test_set_compression_applies_to_later_writes(make_entry: EntryFactory, ssd_url: str) -> None:
    first, second = make_entry(6, num_tokens=32), make_entry(7, num_tokens=32)
    with _store(ssd_url, ram_bytes=0) as store:
        store.put(first)
        store.flush()
        store.set_compression("ssd", "none")
        assert store.compressions() == {"ram": "none", "ssd": "none"}
        store.put(second)
        store.flush()
        headers = {key: read_header(_on_disk(ssd_url, key))
                   for key in (first.key, second.key)}
        assert headers[first.key].compression == "int8" and headers[second.key].compression == "none"
        with pytest.raises(ValueError, match="no tier"):
            store.set_compression("s3", "int8")


@pytest.mark.parametrize("ssd", ["int8", "int4", "none"])
def test_a_layer_stream_decodes_compressed_layers_on_the_device_asked_for(
    make_entry: EntryFactory, ssd_url: str, ssd: str
) -> None:
    # The meta device stands in for a GPU: a decoded layer on it shows where the decoding ran.
    entry = make_entry(5, num_tokens=64, dtype=torch.bfloat16)
    with _store(ssd_url, ssd=ssd, ram_bytes=0) as store:
        store.put(entry)
        store.flush()
        layers = list(store.read_layers(entry.key, decode_device=torch.device("meta")))
        expected = decode(encode(entry, compression_name=ssd), entry.key)[1]
        on_host = torch.stack(list(store.read_layers(entry.key)))
    assert torch.equal(on_host, expected)
    assert [layer.shape for layer in layers] == [layer.shape for layer in expected]
    assert {layer.dtype for layer in layers} == {torch.bfloat16}
    assert {layer.device.type for layer in layers} == ({"cpu"} if ssd == "none" else {"meta"})
