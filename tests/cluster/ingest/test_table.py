"""The document table on a real filesystem and a real S3 endpoint (moto): ids unique per tenant, never overwritten."""
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.config import config_from_dict
from cluster.ingest.table import DocumentRecord, DocumentTable, DuplicateIdError, TableLocation
from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options


def _record(doc_id: str, text: str) -> DocumentRecord:
    return DocumentRecord(doc_id, text, f"key-of-{text}", 3, 300, "fp", "corpus.jsonl", 4)


@pytest.fixture(scope="module")
def s3_location() -> Iterator[TableLocation]:
    with LocalS3() as endpoint_url:
        create_bucket(endpoint_url, "kvcache")
        yield TableLocation("s3://kvcache/documents", s3_storage_options(endpoint_url))


@pytest.mark.parametrize("where", ["file", "s3"])
def test_ids_are_unique_per_tenant(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    location = TableLocation(f"file://{tmp_path}", {}) if where == "file" else request.getfixturevalue("s3_location")
    table = DocumentTable(location)
    assert table.get("acme", "doc-1") is None
    table.put("acme", _record("doc-1", "Paris."))
    table.put("acme", _record("doc-1", "Paris."))  # the same text again: idempotent
    with pytest.raises(DuplicateIdError, match="already used for another text .from corpus.jsonl row 4"):
        table.put("acme", _record("doc-1", "Berlin."))
    assert table.get("acme", "doc-1").text == "Paris."  # not overwritten
    table.put("other", _record("doc-1", "Berlin."))  # another tenant's id space
    assert table.get("other", "doc-1").text == "Berlin."
    assert table.get("acme", "../other/doc-1") is None  # not an id: never a path
    assert table.delete("acme", "doc-1").key == "key-of-Paris."
    assert table.get("acme", "doc-1") is None and table.delete("acme", "doc-1") is None
    assert _record("doc-1", "x").metadata()["key"] == "key-of-x" and "text" not in _record("d", "x").metadata()


def test_the_table_lives_in_the_object_tier_when_there_is_one(tmp_path: Path) -> None:
    local = config_from_dict({"data_dir": str(tmp_path)})
    assert TableLocation.of(local).url == f"file://{tmp_path}/documents"
    tiers = [{"name": "ram", "url": "ram://", "capacity_bytes": 1 << 20},
             {"name": "object", "url": "s3://kvcache/kv/", "capacity_bytes": 1 << 30,
              "storage_options": {"anon": False}}]
    shared = TableLocation.of(config_from_dict({"tiers": tiers}))
    assert shared.url == "s3://kvcache/kv/documents" and shared.storage_options == {"anon": False}
