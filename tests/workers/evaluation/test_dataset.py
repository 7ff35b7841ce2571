"""Reading the shared QA files: limits, offsets, and documents with their titles."""
from pathlib import Path

from tests.workers.conftest import DATA_DIR
from workers.evaluation.dataset import load_records


def test_offset_and_limit_select_a_slice() -> None:
    path = DATA_DIR / "musique_cacheblend.dev.jsonl"
    everything = load_records(path)
    assert len(everything) == 100
    assert [r.id for r in load_records(path, limit=3, offset=50)] == [r.id for r in everything[50:53]]
    assert load_records(path, limit=5, offset=99) == everything[99:]


def test_titled_documents_start_with_their_title() -> None:
    record = load_records(DATA_DIR / "hotpotqa_hipporag.dev.jsonl", limit=1)[0]
    assert record.documents[0].startswith("Demon Dice\nDemon Dice, originally published")
    assert record.answers == ["a spirit"] and len(record.documents) == 10


def test_a_workload_request_stream_reads_as_records() -> None:
    path = Path(__file__).resolve().parents[3] / "docs" / "results" / "workloads" / "2wiki_k8.jsonl"
    record = load_records(path, limit=1)[0]
    assert len(record.documents) == 8 and record.documents[0].startswith("Sarah Silverman: Jesus Is Magic\n")
    assert "United States" in record.answers
