"""Reading the shared QA files: limits, offsets, and documents with their titles."""
from pathlib import Path

import pytest

from tests.workers.conftest import DATA_DIR
from workers.evaluation.dataset import in_conversation, load_records


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


def test_records_in_conversation_follow_the_records_before_them() -> None:
    records = load_records(DATA_DIR / "musique_cacheblend.dev.jsonl", limit=4)
    chats = in_conversation(records, "Be brief.", 2)
    first, third = chats[0].conversation, chats[2].conversation
    assert first is not None and third is not None and first.system == "Be brief."
    assert [(t.role, t.text) for t in third.turns] == [
        ("user", records[0].question), ("assistant", records[0].answers[0]),
        ("user", records[1].question), ("assistant", records[1].answers[0]),
    ]
    assert first.turns[0].text == records[2].question  # cyclic: the first record follows the last ones
    assert chats[2].question == records[2].question and chats[2].documents == records[2].documents
    assert first.documents_at == "last"
    assert in_conversation(records, None, 1, "start")[0].conversation.documents_at == "start"
    with pytest.raises(ValueError, match="num_turns"):
        in_conversation(records, None, 4)
    with pytest.raises(ValueError, match="documents_at"):
        in_conversation(records, None, 1, "middle")
