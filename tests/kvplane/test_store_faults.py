"""TieredStore under damage and pressure: lost files, forged headers, stalled backends, floods by one tenant."""
import os
import signal
import threading
import time
from pathlib import Path

import botocore.session
import pytest
import torch
import xxhash
from botocore.config import Config

from kvplane.codec import _PREFIX, FORMAT_VERSION, MAGIC, ChunkHeader, _align, _pack, encode
from kvplane.entry import KVEntry
from kvplane.keys import chunk_key, key_path
from kvplane.layer_stream import ChunkLost
from kvplane.store import TieredStore
from kvplane.tiers.breaker import Breaker
from kvplane.tiers.fs import LocalFileTier, with_timeouts
from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options
from kvplane.tiers.memory import MemoryTier
from kvplane.tiers.spec import TierSpec
from kvplane.writeback import WriteBack
from tests.kvplane.conftest import FINGERPRINT, EntryFactory


def ssd_file(ssd_url: str, key: str) -> Path:
    return Path(ssd_url.removeprefix("file://")) / key_path(key)


def test_an_entry_deleted_behind_the_stores_back_is_forgotten_reported_and_written_again(
    make_entry: EntryFactory, ssd_url: str
) -> None:
    events: list[tuple[str, str, int]] = []
    entry = make_entry(1)
    with TieredStore.from_specs(
        [TierSpec("ssd", ssd_url, 1 << 20, "lru")], listener=lambda *e: events.append(e)
    ) as store:
        store.put(entry)
        ssd_file(ssd_url, entry.key).unlink()
        assert store.get(entry.key) is None
        assert events[-1] == (entry.key, "ssd", 0)  # the location index hears that it is gone
        assert store.stats().tiers["ssd"].vanished == 1
        store.put(entry)  # the next write (a recompute's write-back) puts it back
        assert ssd_file(ssd_url, entry.key).exists() and torch.equal(store.get(entry.key).kv, entry.kv)


def test_an_eviction_copies_down_again_what_the_lower_tier_lost(make_entry: EntryFactory, ssd_url: str) -> None:
    first, second = make_entry(2), make_entry(3)
    size = encode(first).numel()
    specs = [TierSpec("ram", "ram://", size, "lru"), TierSpec("ssd", ssd_url, 100 * size, "lru")]
    with TieredStore.from_specs(specs) as store:
        store.put(first)
        store.flush()
        ssd_file(ssd_url, first.key).unlink()
        store.put(second)  # evicts `first` from ram; the ssd copy it would rely on is gone
        store.flush()
        assert store.locate(first.key) == "ssd" and torch.equal(store.get(first.key).kv, first.kv)


def forged_blob(key: str, num_layers: int, claimed_shape: tuple[int, ...]) -> torch.Tensor:
    """A blob whose header (with a valid checksum) claims terabytes of layers it does not have."""
    token_ids = list(range(claimed_shape[2]))
    layer_nbytes = 2 * claimed_shape[2] * claimed_shape[3] * claimed_shape[4] * 4

    def header(data_offset: int) -> ChunkHeader:  # offsets are fixed-width, so the draft has the final length
        offsets = tuple(data_offset + i * layer_nbytes for i in range(num_layers))
        return ChunkHeader(key, FINGERPRINT, "float32", claimed_shape, token_ids, 1.0, offsets, (0,) * num_layers)

    data_offset = _align(_PREFIX.size + len(_pack(header(0))))
    packed = _pack(header(data_offset))
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(packed), xxhash.xxh3_64_intdigest(packed))
    raw = prefix + packed + bytes(data_offset - len(prefix) - len(packed)) + b"\x01" * 4096
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def test_a_forged_header_cannot_make_the_layer_stream_allocate_what_it_claims(tmp_path: Path) -> None:
    key = chunk_key(FINGERPRINT, "tenant-a", [7, 8, 9])
    claimed = (4, 2, 3, 1 << 20, 1 << 16)  # 4 layers of 1.5 TiB each
    disk = LocalFileTier("ssd", 1 << 30, f"file://{tmp_path}")
    disk.put(key, forged_blob(key, 4, claimed))
    with TieredStore([MemoryTier("ram", 1 << 20), disk], "lru") as store:
        stream = store.read_layers(key)
        assert stream is not None and stream.tier == "ssd"
        with pytest.raises(ChunkLost):
            next(iter(stream))
        assert store.stats().tiers["ssd"].corruptions == 1 and not disk.contains(key)


def test_the_write_back_queue_is_bounded_and_counts_what_it_refuses() -> None:
    release = threading.Event()
    writer = WriteBack(1, on_error=lambda err: None, max_pending_tasks=3, max_pending_bytes=100)
    accepted = [writer.submit(release.wait, nbytes=10) for _ in range(5)]
    assert accepted == [True, True, True, False, False] and writer.dropped == 2
    release.set()
    writer.flush()
    assert writer.submit(release.wait, nbytes=100) and not writer.submit(release.wait, nbytes=1)
    writer.close()


def test_a_store_whose_lower_tiers_lag_drops_write_backs_instead_of_growing(make_entry: EntryFactory) -> None:
    entries = [make_entry(seed) for seed in range(20)]
    size = encode(entries[0]).numel()
    stalled = threading.Event()

    class StalledTier(MemoryTier):
        def put(self, key: str, blob: torch.Tensor) -> None:
            stalled.wait()
            super().put(key, blob)

    lower = StalledTier("s3", 1 << 30)
    with TieredStore([MemoryTier("ram", 1 << 30), lower], "lru", max_pending_write_bytes=4 * size) as store:
        for entry in entries:
            store.put(entry)
        assert store.stats().write_back_dropped == len(entries) - 4
        stalled.set()
        store.flush()
        assert all(store.get(entry.key) is not None for entry in entries)  # the top tier has every one


def tenant_entry(tenant: str, seed: int) -> KVEntry:
    token_ids = [seed, seed + 1, seed + 2, seed + 3]
    kv = torch.full((1, 2, 4, 3, 8), float(seed))
    return KVEntry(chunk_key(FINGERPRINT, tenant, token_ids), kv, token_ids, FINGERPRINT)


@pytest.mark.parametrize(("share", "kept_fraction"), [(0.5, 1.0), (1.0, 0.0)])
def test_one_tenant_cannot_flood_another_out_of_a_shared_tier(share: float, kept_fraction: float) -> None:
    victim = [tenant_entry("victim", seed) for seed in range(10)]
    size = encode(victim[0]).numel()
    with TieredStore([MemoryTier("ram", 40 * size)], "lru", tenant_share=share) as store:
        for entry in victim:
            store.put(entry)
        for seed in range(400):  # ten times the capacity, re-read so recency favours the flood
            flood = tenant_entry("flood", 1000 + seed)
            store.put(flood)
            store.get(flood.key)
        store.flush()
        kept = sum(store.contains(entry.key) for entry in victim) / len(victim)
    assert kept == kept_fraction


def test_a_tenant_alone_may_fill_the_whole_tier() -> None:
    entries = [tenant_entry("alone", seed) for seed in range(40)]
    with TieredStore([MemoryTier("ram", 40 * encode(entries[0]).numel())], "lru", tenant_share=0.5) as store:
        for entry in entries:
            store.put(entry)
        assert all(store.contains(entry.key) for entry in entries)


def test_temporary_files_of_interrupted_writes_are_swept(make_entry: EntryFactory, ssd_url: str) -> None:
    entry = make_entry(4)
    root = Path(ssd_url.removeprefix("file://"))
    with TieredStore.from_specs([TierSpec("ssd", ssd_url, 1 << 20, "lru")]) as store:
        store.put(entry)
    fresh, old = (ssd_file(ssd_url, entry.key).with_name(f"{entry.key}.tmp-{tag}") for tag in ("fresh", "old"))
    fresh.write_bytes(b"half a write")
    old.write_bytes(b"half a write")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    with TieredStore.from_specs([TierSpec("ssd", ssd_url, 1 << 20, "lru")]) as store:
        assert store.recover() == 1  # the entry, not the temporaries
        assert fresh.exists() and not old.exists()  # only an owner of the folder may sweep fresh ones
        store.recover(temporaries_older_than_s=0.0)
        assert not fresh.exists() and [p.name for p in root.rglob("*") if p.is_file()] == [entry.key]


def test_s3_calls_get_their_own_timeouts_unless_given() -> None:
    options = with_timeouts("s3", {"key": "k"}, 2.0)
    assert options["config_kwargs"]["read_timeout"] == options["config_kwargs"]["connect_timeout"] == 2.0
    client = botocore.session.get_session().create_client(
        "s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s",
        config=Config(**options["config_kwargs"]),
    )
    assert client.meta.config.retries["total_max_attempts"] == 2  # as botocore counts them: the first try included
    assert with_timeouts("s3", {"config_kwargs": {"read_timeout": 9}}, 2.0)["config_kwargs"]["read_timeout"] == 9
    assert with_timeouts("file", {"a": 1}, 2.0) == {"a": 1}


def test_a_stalled_s3_endpoint_costs_one_timeout_then_is_skipped_until_it_answers(make_entry: EntryFactory) -> None:
    entry = make_entry(5)
    server = LocalS3()
    with server as endpoint:
        create_bucket(endpoint, "kvcache")
        spec = TierSpec("s3", "s3://kvcache/stall", 1 << 30, "lru", s3_storage_options(endpoint), timeout_s=1.0)
        with TieredStore.from_specs([spec]) as store:
            store.put(entry)
            os.kill(server.pid, signal.SIGSTOP)
            try:
                start_s = time.monotonic()
                assert store.get(entry.key) is None  # a miss, within the timeout and one retry
                first_s = time.monotonic() - start_s
                start_s = time.monotonic()
                assert store.get(entry.key) is None
                skipped_s = time.monotonic() - start_s
            finally:
                os.kill(server.pid, signal.SIGCONT)
            assert first_s < 6.0 and skipped_s < 0.1, (first_s, skipped_s)
            assert store.stats().tiers["s3"].skipped >= 1 and store.stats().down == ("s3",)
            deadline_s = time.monotonic() + 10
            while store.get(entry.key) is None and time.monotonic() < deadline_s:
                time.sleep(0.2)
            assert torch.equal(store.get(entry.key).kv, entry.kv) and store.stats().down == ()


def test_a_breaker_backs_off_longer_while_failures_go_on_and_closes_on_success() -> None:
    now = [0.0]
    breaker = Breaker(min_backoff_s=1.0, max_backoff_s=4.0, clock=lambda: now[0])
    assert breaker.allows()
    assert [breaker.failed() for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert not breaker.allows()
    now[0] = 4.0
    assert breaker.allows() and breaker.tripped and breaker.succeeded() and not breaker.succeeded()
    assert not breaker.tripped
    assert breaker.failed() == 1.0
