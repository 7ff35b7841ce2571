"""Corpus files read row by row: every bad row refused with its file and row, an unreadable file failed alone."""
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cluster.ingest.retry import Backoff
from cluster.ingest.source import FILE_ROW, Columns, list_corpus, read_corpus_file, row_record

NO_WAIT = Backoff(attempts=1)


def test_a_checked_row_has_its_id_and_text_or_the_problem() -> None:
    assert row_record("f", 3, "doc-1", "Paris.")["problem"] == ""
    assert row_record("f", 3, 17, "Paris.")["id"] == "17"  # integer ids become their decimal text
    assert row_record("f", 3, "doc-1", "   ")["problem"] == "has no text"
    assert row_record("f", 3, "doc-1", None)["problem"] == "has no text"
    assert row_record("f", 3, "doc-1", b"\xff\xfe")["problem"] == "text is not UTF-8 (byte 0)"
    assert row_record("f", 3, None, "Paris.")["problem"] == "has no id"
    assert "URL-safe" in row_record("f", 3, "a/b", "Paris.")["problem"]
    assert row_record("f", 3, "doc-1", 5)["problem"] == "text is a int, not a string"


def test_jsonl_rows_count_lines_and_refuse_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"id": "a", "text": "one"}\n\n{"id": "b"}\n' + b'{"id": "c", "text": "\xff"}\n'
                     + b'not json\n[1]\n{"id": "d", "text": "four"}\n')
    rows = read_corpus_file(str(path), Columns(), {}, NO_WAIT)
    assert [(r["row"], r["id"], r["problem"][:12]) for r in rows] == [
        (1, "a", ""), (3, "b", "has no text"), (4, "", "not UTF-8 (b"), (5, "", "not a JSON o"),
        (6, "", "not a JSON o"), (7, "d", ""),
    ]
    assert all(r["file"] == str(path) for r in rows)


def test_csv_and_parquet_rows_under_named_columns(tmp_path: Path) -> None:
    csv = tmp_path / "corpus.csv"
    csv.write_bytes(b"doc,body,other\nx1,hello,1\nx2,\xff\xfe,2\nx3,,3\n")
    rows = read_corpus_file(str(csv), Columns("doc", "body"), {}, NO_WAIT)
    assert [(r["row"], r["id"], r["text"], r["problem"]) for r in rows] == [
        (1, "x1", "hello", ""), (2, "x2", "", "text is not UTF-8 (byte 0)"), (3, "x3", "", "has no text")]
    parquet = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"doc": ["p1", "p2"], "body": ["first", None]}), parquet)
    rows = read_corpus_file(str(parquet), Columns("doc", "body"), {}, NO_WAIT)
    assert [(r["row"], r["problem"]) for r in rows] == [(1, ""), (2, "has no text")]


def test_an_unreadable_file_is_one_refusal_naming_why(tmp_path: Path) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    [refusal] = read_corpus_file(str(broken), Columns(), {}, NO_WAIT)
    assert refusal["row"] == FILE_ROW and refusal["problem"].startswith("unreadable: ")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "a", "text": "t"}) + "\n")
    csv = tmp_path / "columns.csv"
    csv.write_text("doc,body\na,b\n")
    [missing] = read_corpus_file(str(csv), Columns(), {}, NO_WAIT)
    assert "has no column" in missing["problem"] and "'id'" in missing["problem"]


def test_a_folder_lists_its_corpus_files_only(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    for name in ("a.jsonl", "b/c.parquet", "b/d.csv", "notes.txt"):
        (tmp_path / name).write_text("")
    assert [Path(f).name for f in list_corpus(str(tmp_path), {})] == ["a.jsonl", "c.parquet", "d.csv"]
    with pytest.raises(FileNotFoundError, match="no such file"):
        list_corpus(str(tmp_path / "absent"), {})
    with pytest.raises(ValueError, match="holds no"):
        list_corpus(str(tmp_path / "notes.txt"), {})
