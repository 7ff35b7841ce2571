"""Repeated ids, the manifest, the summary, the actor pool's size and retries (pure)."""
import pyarrow as pa
import pytest

from cluster.ingest.kv_worker import RESULT_SCHEMA
from cluster.ingest.manifest import manifest_table, refusal_rows, repeated_ids, summarize
from cluster.ingest.pipeline import actor_pool, url_options
from cluster.ingest.retry import Backoff, is_transient, with_backoff


def _row(file: str, row: int, doc_id: str, digest: str, problem: str = "") -> dict:
    return {"file": file, "row": row, "id": doc_id, "digest": digest, "problem": problem}


def test_the_first_row_in_source_order_keeps_an_id() -> None:
    rows = [_row("b", 1, "x", "h1"), _row("a", 9, "x", "h2"), _row("a", 2, "y", "h3"), _row("a", 5, "y", "h3"),
            _row("a", 1, "x", "", "has no text")]
    assert repeated_ids(rows) == {
        ("b", 1): "id 'x' repeats a row 9 (another text)",
        ("a", 5): "id 'y' repeats a row 2 (the same text)",
    }


def _result(file: str, row: int, doc_id: str, tokens: int, computed: bool, tiers: str, problem: str = "") -> dict:
    return {"file": file, "row": row, "id": doc_id, "key": f"k-{doc_id}" if not problem else "",
            "num_tokens": tokens, "num_bytes": tokens * 10, "computed": computed, "tiers": tiers, "problem": problem}


def test_manifest_and_summary_in_source_order() -> None:
    results = pa.Table.from_pylist([
        _result("b", 1, "d.1", 5, True, "ram,object"), _result("a", 2, "c", 7, False, "ssd"),
        _result("b", 1, "d.0", 4, True, "ram,object"), _result("a", 1, "", 0, False, "", "has no text"),
    ], schema=RESULT_SCHEMA)
    manifest = manifest_table(results)
    assert manifest["id"].to_pylist() == ["c", "d.0", "d.1"]
    assert refusal_rows(results) == [{"file": "a", "row": 1, "id": "", "problem": "has no text"}]
    summary = summarize(manifest, num_refused=1, num_files=2, elapsed_s=2.0)
    assert (summary.num_documents, summary.num_chunks, summary.num_tokens) == (2, 3, 16)
    assert (summary.num_computed_chunks, summary.num_computed_tokens, summary.num_skipped_chunks) == (2, 9, 1)
    assert summary.bytes_by_tier == {"object": 90, "ram": 90, "ssd": 70}
    assert summary.as_dict()["tokens_per_s"] == 4.5


def test_the_pool_takes_the_free_gpus_else_the_free_cpus() -> None:
    assert actor_pool({"CPU": 8.0, "GPU": 2.0}, 4) == actor_pool({"GPU": 2.0}, 1)
    assert actor_pool({"CPU": 8.0, "GPU": 2.0}, 4).num_actors == 2
    assert actor_pool({"CPU": 7.0}, 2).num_actors == 3 and actor_pool({"CPU": 7.0}, 2).num_cpus == 2
    assert actor_pool({"CPU": 0.5}, 1).num_actors == 1
    assert actor_pool({"CPU": 8.0}, 1, num_actors=2).num_actors == 2


def test_storage_options_follow_the_url_scheme() -> None:
    options = {"s3": {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}}
    assert url_options("s3://bucket/corpus", options) == options["s3"]
    assert url_options("/tmp/corpus.jsonl", options) == {} and url_options("gs://b/c", options) == {}


def test_transient_errors_are_retried_with_growing_waits() -> None:
    waits: list[float] = []
    calls = iter([ConnectionResetError("reset"), TimeoutError("slow"), "done"])

    def flaky() -> str:
        result = next(calls)
        if isinstance(result, Exception):
            raise result
        return result

    assert with_backoff(flaky, "reading", Backoff(4, 0.5), waits.append) == "done"
    assert waits == [0.5, 1.0]
    assert not is_transient(FileNotFoundError("gone")) and not is_transient(ValueError("bad"))
    with pytest.raises(FileNotFoundError):
        with_backoff(lambda: (_ for _ in ()).throw(FileNotFoundError("gone")), "reading", Backoff(4, 0.5), waits.append)
    assert waits == [0.5, 1.0]  # a missing object is not tried again
    with pytest.raises(OSError, match="down"):
        with_backoff(lambda: (_ for _ in ()).throw(OSError("down")), "reading", Backoff(2, 0.1), waits.append)
    assert waits == [0.5, 1.0, 0.1]
