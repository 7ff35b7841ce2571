"""Read the shared multi-document QA files (one JSON record per line)."""
import json
from dataclasses import dataclass, replace
from pathlib import Path

from workers.generation.conversation import Conversation, Turn


@dataclass(frozen=True, slots=True)
class QARecord:
    """A question, its gold answers and its retrieved documents in retrieval order."""

    id: str
    question: str
    answers: list[str]
    documents: list[str]
    conversation: Conversation | None = None  # asked as the last turn of a chat (None: a single question)


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


def in_conversation(
    records: list[QARecord], system: str | None, num_turns: int, documents_at: str = "last"
) -> list[QARecord]:
    """Each record asked after `system` and `num_turns` earlier exchanges: the records before it (cyclically),
    each a user question and its first gold answer from the assistant; the documents where `documents_at` says."""
    if num_turns < 0 or (num_turns and len(records) <= num_turns):
        raise ValueError(f"num_turns must be in [0, {len(records) - 1}], got {num_turns}")
    asked = []
    for index, record in enumerate(records):
        earlier = [records[(index - num_turns + k) % len(records)] for k in range(num_turns)]
        turns = tuple(t for past in earlier for t in (Turn("user", past.question), Turn("assistant", past.answers[0])))
        asked.append(replace(record, conversation=Conversation(system, turns, documents_at)))
    return asked
