"""Compression verdicts: recorded once in a real folder or S3 bucket, read by a gate that every store consults."""
import time

import pytest
import torch

from kvplane.compression.verdicts import VerdictBook, VerdictGate
from kvplane.store import TieredStore
from kvplane.tiers.local_s3 import s3_storage_options
from kvplane.tiers.spec import TierSpec
from tests.kvplane.conftest import BUCKET, FINGERPRINT, EntryFactory


@pytest.fixture(params=["file", "s3"])
def book(request: pytest.FixtureRequest, tmp_path) -> VerdictBook:
    if request.param == "file":
        return VerdictBook(f"file://{tmp_path / 'verdicts'}")
    endpoint = request.getfixturevalue("s3_endpoint")
    return VerdictBook(f"s3://{BUCKET}/{tmp_path.name}/verdicts", s3_storage_options(endpoint))


def test_a_verdict_is_read_back_by_model_and_compression(book: VerdictBook) -> None:
    assert book.get(FINGERPRINT, "int8") is None
    book.put(FINGERPRINT, "int8", {"passed": True, "kl_increase": 0.0004})
    assert book.get(FINGERPRINT, "int8") == {"passed": True, "kl_increase": 0.0004}
    assert book.get(FINGERPRINT, "int4") is None and book.get("another-model", "int8") is None
    with pytest.raises(ValueError, match="passed"):
        book.put(FINGERPRINT, "int4", {"kl_increase": 0.03})


def test_the_gate_allows_only_a_passed_verdict_and_reads_again_after_a_while(tmp_path) -> None:
    book = VerdictBook(f"file://{tmp_path}")
    gate = VerdictGate(book, recheck_s=0.2)
    assert not gate.allows(FINGERPRINT, "int8")  # no verdict yet
    book.put(FINGERPRINT, "int8", {"passed": True})
    book.put(FINGERPRINT, "int4", {"passed": False})
    assert not gate.allows(FINGERPRINT, "int8")  # the absence is remembered until the recheck
    time.sleep(0.25)
    assert gate.allows(FINGERPRINT, "int8") and not gate.allows(FINGERPRINT, "int4")


def test_a_store_compresses_only_what_the_gate_allows(make_entry: EntryFactory, tmp_path) -> None:
    book = VerdictBook(f"file://{tmp_path / 'verdicts'}")
    book.put(FINGERPRINT, "int4", {"passed": False})
    specs = [TierSpec("ram", "ram://", 1 << 20, "lru", compression="int8"),
             TierSpec("ssd", f"file://{tmp_path / 'ssd'}", 1 << 24, "lru", compression="int4")]
    first, second = make_entry(1, num_tokens=32), make_entry(2, num_tokens=32)
    with TieredStore.from_specs(specs, gate=VerdictGate(book, recheck_s=0.0)) as store:
        store.put(first)
        store.flush()
        stats = store.stats().tiers
        assert (stats["ram"].codec_refused, stats["ssd"].codec_refused) == (1, 1)
        assert torch.equal(store.get(first.key).kv, first.kv)  # kept exact where refused
        book.put(FINGERPRINT, "int8", {"passed": True})
        store.put(second)
        store.flush()
        stats = store.stats().tiers
        assert (stats["ram"].compressed, stats["ssd"].compressed, stats["ssd"].codec_refused) == (1, 0, 2)
        assert not torch.equal(store.get(second.key).kv, second.kv)  # int8 now
