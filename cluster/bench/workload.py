"""The serving benchmark's workload file: one request per JSON line (question, documents, gold answers)."""
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """One RAG request: the question, its documents in prompt order (one chunk each), and gold answers."""

    id: str
    question: str
    documents: tuple[str, ...]
    answers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("id must be a non-empty string")
        if not self.question.strip():
            raise ValueError(f"request {self.id}: question must be non-empty")
        if any(not document.strip() for document in self.documents):
            raise ValueError(f"request {self.id}: every document must be non-empty text")

    def to_json(self) -> dict[str, object]:
        """The request as one JSON object of the workload file."""
        return {
            "id": self.id,
            "question": self.question,
            "documents": list(self.documents),
            "answers": list(self.answers),
        }

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> "WorkloadRequest":
        """Read one line's object; missing answers mean none."""
        return cls(
            str(raw["id"]),
            str(raw["question"]),
            tuple(str(d) for d in raw["documents"]),  # type: ignore[union-attr]
            tuple(str(a) for a in raw.get("answers", ())),  # type: ignore[union-attr]
        )


def write_workload(path: Path, requests: Iterable[WorkloadRequest]) -> int:
    """Write requests as JSON lines; returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w") as handle:
        for request in requests:
            handle.write(json.dumps(request.to_json()) + "\n")
            count += 1
    return count


def read_workload(path: Path, limit: int | None = None, offset: int = 0) -> list[WorkloadRequest]:
    """`limit` requests after the first `offset` of a workload file."""
    requests = []
    with open(path) as handle:
        for index, line in enumerate(handle):
            if limit is not None and len(requests) >= limit:
                break
            if index >= offset and line.strip():
                requests.append(WorkloadRequest.from_json(json.loads(line)))
    return requests


def distinct_documents(requests: Sequence[WorkloadRequest]) -> list[str]:
    """Every document the workload uses, once, in first-use order."""
    return list(dict.fromkeys(document for request in requests for document in request.documents))


def document_id(text: str) -> str:
    """A URL-safe id naming a document by its text, so a workload's documents can be ingested and sent by id."""
    return "w-" + hashlib.sha256(text.encode()).hexdigest()[:24]
