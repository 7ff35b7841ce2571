"""The functions Ray Data runs on plain rows, in a module that never imports torch.

A Ray worker imports the module of each function it runs; these run before the chunk-KV actors exist. With
the pipeline's imports (torch, the model code) the read stage of 200 passages on a 1-CPU node took 7.5-9.5 s,
without them 2.6 s.
"""
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from cluster.ingest.source import Columns, read_corpus_file


def read_rows(item: dict[str, Any], columns: Columns, storage_options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Ray Data's flat_map over the file list: the rows of one corpus file."""
    return read_corpus_file(item["file"], columns, storage_options)


def mark_repeats(batch: pa.Table, repeats: Mapping[tuple[str, int], str]) -> pa.Table:
    """The rows with the problem of an id an earlier row took."""
    if not repeats:
        return batch
    problems = [repeats.get((file, row), problem) for file, row, problem in
                zip(batch["file"].to_pylist(), batch["row"].to_pylist(), batch["problem"].to_pylist())]
    return batch.set_column(batch.schema.get_field_index("problem"), "problem", pa.array(problems, pa.string()))
