"""One ingest actor's work: a batch of corpus rows chunked, their KV computed and stored, their ids recorded.

`ChunkKVIngest` holds the logic; `ChunkKVActor` is the thin callable Ray Data runs on each actor of the pool.
"""
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import ray
import torch

from cluster.compression_verdicts import verdict_book
from cluster.config import ServeConfig, config_from_dict
from cluster.ingest.chunking import ChunkRule, piece_id, split_text
from cluster.ingest.table import DocumentRecord, DocumentTable, DuplicateIdError, TableLocation
from cluster.worker_setup import open_node_shards
from kvplane.compression.verdicts import VerdictGate
from kvplane.ray.location_index import launch_location_index
from kvplane.ray.worker_store import open_worker_tiered_store
from kvplane.store import TieredStore
from workers.chunks.kvplane_store import KVPlaneChunkStore
from workers.fuser import Fuser
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import torch_dtype
from workers.model.runner import ModelRunner

RESULT_SCHEMA = pa.schema([
    ("file", pa.string()), ("row", pa.int64()), ("id", pa.string()), ("key", pa.string()),
    ("num_tokens", pa.int64()), ("num_bytes", pa.int64()), ("computed", pa.bool_()), ("tiers", pa.string()),
    ("problem", pa.string()),
])


def open_ingest_store(config: ServeConfig) -> TieredStore:
    """The cluster's node shards (each key written to the shard that owns it) and its object tier, no device tier."""
    directory = open_node_shards(config, launch_location_index())
    shared = config.tier("object")
    return open_worker_tiered_store(
        0,
        directory,
        object_store=None if shared is None else shared.to_spec(),
        local_node_id=ray.get_runtime_context().get_node_id(),
        tenant_share=config.server.tenant_cache_share,
        gate=VerdictGate(verdict_book(config)),
    )


@dataclass(frozen=True, slots=True)
class Piece:
    """One chunk to store: its id, text and the row it came from."""

    id: str
    text: str
    file: str
    row: int


def result_row(piece: Piece, problem: str = "", key: str = "", num_tokens: int = 0, num_bytes: int = 0,
               computed: bool = False, tiers: str = "") -> dict[str, Any]:
    """A row of the job's results: a stored chunk (problem empty) or a refusal."""
    return {"file": piece.file, "row": piece.row, "id": piece.id, "key": key, "num_tokens": num_tokens,
            "num_bytes": num_bytes, "computed": computed, "tiers": tiers, "problem": problem}


class ChunkKVIngest:
    """The served model's chunk KV, computed as `POST /v1/documents` computes it, into the cluster's store."""

    def __init__(
        self, fuser: Fuser, table: DocumentTable, tenant: str, rule: ChunkRule, max_context_tokens: int
    ) -> None:
        self.fuser = fuser
        self.table = table
        self.tenant = tenant
        self.rule = rule
        self.max_context_tokens = max_context_tokens
        self.bytes_per_token = fuser.runner.config.kv_values_per_token * fuser.runner.dtype.itemsize

    def pieces(self, row: Mapping[str, Any]) -> list[Piece]:
        """The chunks of one checked row under the rule."""
        if self.rule.max_tokens is None:
            return [Piece(row["id"], row["text"], row["file"], row["row"])]
        texts = split_text(row["text"], self.rule.max_tokens, self._token_starts, self._count_tokens)
        return [Piece(piece_id(row["id"], i), text, row["file"], row["row"]) for i, text in enumerate(texts)]

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Store the KV and table entries of a batch of rows; one result per chunk or refused row, in order."""
        results: list[dict[str, Any] | None] = []
        accepted: list[tuple[int, Piece]] = []
        for row in rows:
            if row["problem"]:
                results.append(result_row(Piece(row["id"], "", row["file"], row["row"]), row["problem"]))
                continue
            for piece in self.pieces(row):
                problem = self._problem(piece)
                results.append(result_row(piece, problem) if problem else None)
                if not problem:
                    accepted.append((len(results) - 1, piece))
        if accepted:
            stored = self.fuser.store_documents([piece.text for _, piece in accepted], self.tenant)
            fingerprint = self.fuser.store.fingerprint
            for (slot, piece), chunk in zip(accepted, stored):
                num_bytes = chunk.num_tokens * self.bytes_per_token
                record = DocumentRecord(piece.id, piece.text, chunk.key, chunk.num_tokens, num_bytes, fingerprint,
                                        piece.file, piece.row)
                try:
                    self.table.put(self.tenant, record)
                except DuplicateIdError as error:
                    results[slot] = result_row(piece, str(error))
                    continue
                results[slot] = result_row(piece, "", chunk.key, chunk.num_tokens, num_bytes, chunk.computed,
                                           ",".join(chunk.tiers))
        return [r for r in results if r is not None]

    def _problem(self, piece: Piece) -> str:
        """Why a chunk cannot be stored (empty when it can): longer than the context, or its id taken."""
        prompt = self.fuser.layout([piece.text], "")
        num_tokens = len(prompt.chunk_context_ids) + len(prompt.chunk_ids[0])
        if num_tokens > self.max_context_tokens:
            return (f"{num_tokens} tokens with the prompt prefix exceed the model's context of "
                    f"{self.max_context_tokens} (split it: --chunk tokens:N)")
        found = self.table.get(self.tenant, piece.id)
        if found is not None and found.text != piece.text:
            where = f" (from {found.file} row {found.row})" if found.file else ""
            return f"id {piece.id!r} is already used for another text{where}"
        return ""

    def _token_starts(self, text: str) -> list[int]:
        encoded = self.fuser.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [start for start, _ in encoded.offset_mapping]

    def _count_tokens(self, text: str) -> int:
        return len(self.fuser.layout([text], "").chunk_ids[0])


def load_ingest(config: ServeConfig, dtype: str, tenant: str, rule: ChunkRule) -> ChunkKVIngest:
    """The served model in `dtype` over the cluster's store, as the serving workers compute chunk KV."""
    path = config.model.path or prepare_default_model()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    runner = ModelRunner(load_checkpoint(path, torch_dtype(dtype), device))
    template = config.prompt.template(runner.checkpoint.tokenizer)
    store = KVPlaneChunkStore(open_ingest_store(config), runner.checkpoint.fingerprint)
    fuser = Fuser(runner, store=store, template=template, chunk_context=config.engine.chunk_context)
    max_context = runner.config.max_position_embeddings
    if config.engine.kind == "vllm":  # its context may be set shorter than the model's
        max_context = min(max_context, config.engine.vllm.max_model_len)
    return ChunkKVIngest(fuser, DocumentTable(TableLocation.of(config)), tenant, rule, max_context)


class ChunkKVActor:
    """Ray Data's callable on each actor of the pool: loads the model once, then stores batch after batch."""

    def __init__(self, config: dict[str, Any], dtype: str, tenant: str, rule: str, num_threads: int) -> None:
        torch.set_num_threads(num_threads)
        self.ingest = load_ingest(config_from_dict(config), dtype, tenant, ChunkRule.parse(rule))
        self.counters = IngestCounters(tenant)

    def __call__(self, batch: pa.Table) -> pa.Table:
        results = self.ingest.process(batch.to_pylist())
        self.counters.count(results)
        return pa.Table.from_pylist(results, schema=RESULT_SCHEMA)


class IngestCounters:
    """Prometheus counters through Ray's metrics export (scraped from every node of a serving cluster)."""

    def __init__(self, tenant: str) -> None:
        from ray.util.metrics import Counter

        tags = ("tenant", "outcome")
        self._tenant = tenant
        self._chunks = Counter("blendserve_ingest_chunks", "Chunks ingested, by outcome.", tag_keys=tags)
        self._tokens = Counter("blendserve_ingest_tokens", "Tokens of the chunks ingested, by outcome.", tag_keys=tags)
        self._bytes = Counter("blendserve_ingest_kv_bytes", "KV bytes of the chunks computed.", tag_keys=("tenant",))

    def count(self, results: list[dict[str, Any]]) -> None:
        """Add one batch's results."""
        for row in results:
            outcome = "refused" if row["problem"] else "computed" if row["computed"] else "skipped"
            tags = {"tenant": self._tenant, "outcome": outcome}
            self._chunks.inc(1, tags)
            if row["num_tokens"]:
                self._tokens.inc(row["num_tokens"], tags)
            if row["computed"]:
                self._bytes.inc(row["num_bytes"], {"tenant": self._tenant})
