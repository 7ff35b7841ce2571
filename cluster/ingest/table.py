"""The document table: each ingested chunk's text and metadata by tenant and id, where every ingress can read it.

One small JSON object per document under `<root>/t-<tenant>/<id>.json`: in the object tier when the cluster
has one (shared by every node), else under the data folder (a one-node deployment). Lookups by id are one read.
"""
import json
import posixpath
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import fsspec

from cluster.ingest.chunking import id_problem
from cluster.ingest.retry import Backoff, with_backoff
from kvplane.tiers.fs import with_timeouts

if TYPE_CHECKING:  # annotations only: the table is read where no configuration is loaded
    from cluster.config import ServeConfig

TABLE_FOLDER = "documents"
TABLE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class DocumentRecord:
    """One ingested chunk: its id and text, the key its KV is stored under, and where it came from."""

    id: str
    text: str
    key: str
    num_tokens: int
    num_bytes: int
    fingerprint: str  # the model and dtype the key was made for (a changed one re-ingests)
    file: str = ""
    row: int = 0

    def __post_init__(self) -> None:
        problem = id_problem(self.id)
        if problem is not None:
            raise ValueError(problem)
        if not self.text:
            raise ValueError(f"document {self.id!r} needs a text")

    def metadata(self) -> dict[str, Any]:
        """Everything but the text."""
        return {name: value for name, value in asdict(self).items() if name != "text"}


class DuplicateIdError(ValueError):
    """An id the tenant already uses for another text."""


@dataclass(frozen=True, slots=True)
class TableLocation:
    """Where a deployment's document table lives: a URL and the storage options to open it."""

    url: str
    storage_options: Mapping[str, Any]

    @classmethod
    def of(cls, config: "ServeConfig") -> "TableLocation":
        """In the object tier when configured (every node reads it), else under the data folder."""
        return cls(*config.shared_folder(TABLE_FOLDER))


class DocumentTable:
    """Documents by tenant and id; writing another text under a used id is refused, never overwritten."""

    def __init__(self, location: TableLocation, backoff: Backoff = Backoff()) -> None:
        protocol = location.url.split("://", 1)[0]
        options = with_timeouts(protocol, {"use_listings_cache": False, **location.storage_options}, TABLE_TIMEOUT_S)
        self._fs, self._root = fsspec.core.url_to_fs(location.url, **options)
        self._backoff = backoff

    def get(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        """The tenant's document of that id, or None."""
        if id_problem(doc_id) is not None:
            return None
        try:
            data = with_backoff(lambda: self._fs.cat_file(self._path(tenant, doc_id)), f"reading {doc_id}",
                                self._backoff)
        except FileNotFoundError:
            return None
        return DocumentRecord(**json.loads(data))

    def put(self, tenant: str, record: DocumentRecord) -> None:
        """Keep `record` for the tenant (the same text again updates it); DuplicateIdError for another text."""
        found = self.get(tenant, record.id)
        if found is not None and found.text != record.text:
            where = f" (from {found.file} row {found.row})" if found.file else ""
            raise DuplicateIdError(f"id {record.id!r} is already used for another text{where}")
        path = self._path(tenant, record.id)
        body = json.dumps(asdict(record)).encode()
        self._fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with_backoff(lambda: self._fs.pipe_file(path, body), f"writing {record.id}", self._backoff)

    def delete(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        """Remove the tenant's document of that id; the record it held, or None when there was none."""
        found = self.get(tenant, doc_id)
        if found is not None:
            with_backoff(lambda: self._fs.rm_file(self._path(tenant, doc_id)), f"deleting {doc_id}", self._backoff)
        return found

    def _path(self, tenant: str, doc_id: str) -> str:
        # `t-` keeps a tenant named '.' or '..' (valid tenant names) a folder of its own.
        return posixpath.join(self._root, f"t-{tenant}", f"{doc_id}.json")
