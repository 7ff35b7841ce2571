"""Read the shared multi-document QA files (one JSON record per line)."""
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class QARecord:
    """A question, its gold answers and its retrieved documents in retrieval order."""

    id: str
    question: str
    answers: list[str]
    documents: list[str]


def load_records(path: Path, limit: int | None = None, offset: int = 0) -> list[QARecord]:
    """`limit` records after the first `offset`; a document is its title line (when there is one) and its text.

    Also reads a workload's request stream (docs/results/workloads/*.jsonl: `documents` as text, `answers`).
    """
    records = []
    with open(path) as handle:
        for index, line in enumerate(handle):
            if limit is not None and len(records) >= limit:
                break
            if index < offset:
                continue
            raw = json.loads(line)
            if "ctxs" in raw:
                docs = [f"{c['title']}\n{c['text']}" if c.get("title") else c["text"] for c in raw["ctxs"]]
            else:  # a request stream of bench/workloads.py: documents already as text
                docs = list(raw["documents"])
            records.append(QARecord(str(raw["id"]), raw["question"], list(raw["answers"]), docs))
    return records
