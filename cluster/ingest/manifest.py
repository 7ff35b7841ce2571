"""What an ingest job produced, from its result rows: the manifest, the refusals, the summary (pure)."""
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

MANIFEST_COLUMNS = ("id", "key", "num_tokens", "num_bytes", "file", "row", "computed", "tiers")
REFUSAL_COLUMNS = ("file", "row", "id", "problem")


def repeated_ids(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], str]:
    """Rows refused because an earlier row (in file and row order) already took their id: (file, row) -> why.

    Ids are unique per tenant: a later row with another text is refused, and one with the same text too (it
    adds nothing), so each id is stored from exactly one row whichever actor reaches it first.
    """
    first: dict[str, tuple[str, int, str]] = {}
    refused: dict[tuple[str, int], str] = {}
    for row in sorted((r for r in rows if not r["problem"]), key=lambda r: (r["file"], r["row"])):
        taken = first.get(row["id"])
        if taken is None:
            first[row["id"]] = (row["file"], row["row"], row["digest"])
            continue
        file, number, digest = taken
        same = "the same text" if digest == row["digest"] else "another text"
        refused[(row["file"], row["row"])] = f"id {row['id']!r} repeats {file} row {number} ({same})"
    return refused


def manifest_table(results: pa.Table) -> pa.Table:
    """The stored chunks in source order: ids, keys, tokens, bytes, where they came from and where they are."""
    stored = results.filter(pa.compute.equal(results["problem"], ""))
    return stored.select(list(MANIFEST_COLUMNS)).sort_by([("file", "ascending"), ("row", "ascending"),
                                                         ("id", "ascending")])


def refusal_rows(results: pa.Table) -> list[dict[str, Any]]:
    """The refused rows and files in source order, each with why."""
    refused = results.filter(pa.compute.not_equal(results["problem"], ""))
    ordered = refused.select(list(REFUSAL_COLUMNS)).sort_by([("file", "ascending"), ("row", "ascending")])
    return ordered.to_pylist()


@dataclass(slots=True)
class IngestSummary:
    """One job's totals; tokens_per_s counts the tokens computed over the job's whole wall time."""

    num_files: int
    num_documents: int  # source rows with at least one stored chunk
    num_chunks: int
    num_tokens: int
    num_computed_chunks: int
    num_computed_tokens: int
    num_skipped_chunks: int  # already stored under the same key: not computed again
    num_refused: int  # refused rows (and unreadable files)
    elapsed_s: float
    bytes_by_tier: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Computed tokens per second of the job."""
        return self.num_computed_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON, with tokens_per_s."""
        return {**asdict(self), "tokens_per_s": round(self.tokens_per_s, 1)}


def summarize(manifest: pa.Table, num_refused: int, num_files: int, elapsed_s: float) -> IngestSummary:
    """The summary of a job whose stored chunks are `manifest`."""
    rows = manifest.to_pylist()
    computed = [r for r in rows if r["computed"]]
    by_tier: dict[str, int] = defaultdict(int)
    for row in rows:
        for tier in filter(None, row["tiers"].split(",")):
            by_tier[tier] += row["num_bytes"]
    return IngestSummary(
        num_files=num_files,
        num_documents=len({(r["file"], r["row"]) for r in rows}),
        num_chunks=len(rows),
        num_tokens=sum(r["num_tokens"] for r in rows),
        num_computed_chunks=len(computed),
        num_computed_tokens=sum(r["num_tokens"] for r in computed),
        num_skipped_chunks=len(rows) - len(computed),
        num_refused=num_refused,
        elapsed_s=elapsed_s,
        bytes_by_tier=dict(sorted(by_tier.items())),
    )
