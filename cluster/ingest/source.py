"""A corpus on disk or in object storage: its files (Parquet, JSONL, CSV), and each file's rows with their numbers."""
import json
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import xxhash
from pyarrow.fs import FSSpecHandler, PyFileSystem

from cluster.ingest.chunking import id_problem
from cluster.ingest.retry import Backoff, with_backoff

FORMATS: Mapping[str, str] = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv"}
FILE_ROW = 0  # the row number a refusal of a whole file carries (rows count from 1)


@dataclass(frozen=True, slots=True)
class Columns:
    """Which columns of the corpus hold a row's id and its text."""

    id: str = "id"
    text: str = "text"

    def __post_init__(self) -> None:
        if not self.id or not self.text or self.id == self.text:
            raise ValueError(f"the id and text columns must be two named columns, got {self.id!r}, {self.text!r}")


def corpus_format(path: str) -> str | None:
    """The format a file's suffix names, or None for a file that is no corpus."""
    return FORMATS.get(posixpath.splitext(path)[1].lower())


def list_corpus(source: str, storage_options: Mapping[str, Any]) -> list[str]:
    """The corpus files of `source` (one file, or every Parquet/JSONL/CSV file under a folder), as URLs, sorted."""
    fs, root = fsspec.core.url_to_fs(source, **storage_options)
    protocol = source.split("://", 1)[0] if "://" in source else "file"
    found = with_backoff(lambda: fs.find(root) if fs.isdir(root) else [root] if fs.exists(root) else [],
                         f"listing {source}")
    if not found:
        raise FileNotFoundError(f"{source}: no such file or folder")
    files = sorted(path for path in found if corpus_format(path) is not None)
    if not files:
        raise ValueError(f"{source}: holds no .parquet, .jsonl, .json or .csv file")
    return [path if protocol == "file" else f"{protocol}://{path}" for path in files]


def row_record(file: str, row: int, doc_id: Any, text: Any) -> dict[str, Any]:
    """One corpus row checked: its id and text as strings, or the problem that refuses it (empty when none)."""
    problem = ""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            text, problem = "", f"text is not UTF-8 (byte {error.start})"
    if isinstance(doc_id, bytes):
        try:
            doc_id = doc_id.decode("utf-8")
        except UnicodeDecodeError:
            doc_id, problem = "", problem or "id is not UTF-8"
    doc_id = "" if doc_id is None else str(doc_id)
    if not problem and not isinstance(text, str):
        text, problem = "", "has no text" if text is None else f"text is a {type(text).__name__}, not a string"
    if not problem and not text.strip():
        problem = "has no text"
    if not problem:
        problem = "has no id" if not doc_id else id_problem(doc_id) or ""
    digest = xxhash.xxh3_64_hexdigest(text.encode()) if not problem else ""
    return {"file": file, "row": row, "id": doc_id, "text": "" if problem else text, "digest": digest,
            "problem": problem}


def file_refusal(file: str, problem: str) -> dict[str, Any]:
    """A file that could not be read as a whole: one refusal, at row FILE_ROW."""
    return {"file": file, "row": FILE_ROW, "id": "", "text": "", "digest": "", "problem": problem}


def read_corpus_file(file: str, columns: Columns, storage_options: Mapping[str, Any],
                     backoff: Backoff = Backoff()) -> list[dict[str, Any]]:
    """Every row of one file, checked; an unreadable file is one refusal naming why (transient errors retried)."""
    reader = {"parquet": _parquet_rows, "jsonl": _jsonl_rows, "csv": _csv_rows}[corpus_format(file) or "jsonl"]
    try:
        return with_backoff(lambda: list(reader(file, columns, storage_options)), f"reading {file}", backoff)
    except Exception as error:  # any failure fails this file alone; the job goes on with the others
        return [file_refusal(file, f"unreadable: {error}")]


def _parquet_rows(file: str, columns: Columns, storage_options: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    fs, path = fsspec.core.url_to_fs(file, **storage_options)
    parquet = pq.ParquetFile(path, filesystem=PyFileSystem(FSSpecHandler(fs)))
    _check_columns(parquet.schema_arrow, columns, file)
    row = 0
    for batch in parquet.iter_batches(columns=[columns.id, columns.text]):
        for doc_id, text in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            row += 1
            yield row_record(file, row, doc_id, text)


def _csv_rows(file: str, columns: Columns, storage_options: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    # Both columns as bytes: a row whose text is not UTF-8 is refused alone instead of failing the file.
    options = pacsv.ConvertOptions(column_types={columns.id: pa.binary(), columns.text: pa.binary()},
                                   include_columns=[columns.id, columns.text])
    with fsspec.open(file, "rb", **storage_options) as handle:
        try:
            table = pacsv.read_csv(handle, convert_options=options)
        except KeyError as error:
            raise ValueError(f"has no column {error}") from None
    _check_columns(table.schema, columns, file)
    for row, (doc_id, text) in enumerate(zip(table[columns.id].to_pylist(), table[columns.text].to_pylist()), 1):
        yield row_record(file, row, doc_id, text)


def _jsonl_rows(file: str, columns: Columns, storage_options: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    with fsspec.open(file, "rb", **storage_options) as handle:
        lines = handle.read().split(b"\n")
    for row, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            yield {**row_record(file, row, "", ""), "problem": f"not UTF-8 (byte {error.start})"}
            continue
        except ValueError as error:
            yield {**row_record(file, row, "", ""), "problem": f"not a JSON object ({error})"}
            continue
        if not isinstance(value, dict):
            yield {**row_record(file, row, "", ""), "problem": "not a JSON object"}
            continue
        yield row_record(file, row, value.get(columns.id), value.get(columns.text))


def _check_columns(schema: pa.Schema, columns: Columns, file: str) -> None:
    missing = [name for name in (columns.id, columns.text) if name not in schema.names]
    if missing:
        raise ValueError(f"has no column {missing[0]!r} (columns: {schema.names[:10]})")
