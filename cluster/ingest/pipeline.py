"""The ingest job on Ray Data: read -> check ids -> chunk KV on an actor pool -> manifest, refusals, summary."""
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from cluster.config import ServeConfig, config_to_dict
from cluster.config_schema import TENANT_RULE, is_tenant_name
from cluster.ingest.chunking import ChunkRule
from cluster.ingest.kv_worker import RESULT_SCHEMA, ChunkKVActor
from cluster.ingest.manifest import IngestSummary, manifest_table, refusal_rows, repeated_ids, summarize
from cluster.ingest.row_tasks import mark_repeats, read_rows
from cluster.ingest.source import Columns, list_corpus
from cluster.worker_setup import worker_dtype
from workers.model.default import prepare_default_model

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestJob:
    """What to ingest, under which tenant and chunk rule, where the manifest and refusals go, on how many actors."""

    source: str
    manifest_url: str
    refusals_url: str
    columns: Columns = Columns()
    tenant: str = "default"
    rule: ChunkRule = ChunkRule()
    num_actors: int | None = None  # None: one per GPU, else one per `threads_per_actor` free CPUs
    threads_per_actor: int = 1
    rows_per_batch: int = 32  # rows handed to an actor at once (their chunks share packed forward passes)
    storage_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # by URL scheme (s3: ...)

    def __post_init__(self) -> None:
        if not is_tenant_name(self.tenant):
            raise ValueError(f"tenant must be {TENANT_RULE}, got {self.tenant!r}")
        if self.num_actors is not None and self.num_actors < 1:
            raise ValueError(f"num_actors must be >= 1 or None, got {self.num_actors}")
        if self.threads_per_actor < 1:
            raise ValueError(f"threads_per_actor must be >= 1, got {self.threads_per_actor}")
        if self.rows_per_batch < 1:
            raise ValueError(f"rows_per_batch must be >= 1, got {self.rows_per_batch}")


@dataclass(frozen=True, slots=True)
class ActorPool:
    """How many chunk-KV actors run and what each takes."""

    num_actors: int
    num_cpus: float
    num_gpus: float


def actor_pool(available: Mapping[str, float], threads_per_actor: int, num_actors: int | None = None) -> ActorPool:
    """One actor per free GPU, else one per `threads_per_actor` free CPUs (at least one); `num_actors` overrides."""
    gpus = int(available.get("GPU", 0))
    if gpus > 0:
        return ActorPool(num_actors or gpus, 1, 1)
    cpus = int(available.get("CPU", 0))
    return ActorPool(num_actors or max(1, cpus // threads_per_actor), threads_per_actor, 0)


def url_options(url: str, by_scheme: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The storage options for `url`: those of its scheme, none for a local path."""
    return dict(by_scheme.get(url.split("://", 1)[0], {})) if "://" in url else {}


def run_ingest(config: ServeConfig, job: IngestJob) -> IngestSummary:
    """Ingest `job.source` on the Ray cluster this process is connected to; writes the manifest and refusals."""
    start_s = time.monotonic()
    dtype = worker_dtype(config, config.model.path or prepare_default_model())  # the serving workers' dtype
    files = list_corpus(job.source, url_options(job.source, job.storage_options))
    pool = actor_pool(ray.available_resources(), job.threads_per_actor, job.num_actors)
    _log.info("ingest: %d files, %d actors (%g CPUs, %g GPUs each), dtype %s", len(files), pool.num_actors,
              pool.num_cpus, pool.num_gpus, dtype)
    rows = ray.data.from_items([{"file": f} for f in files], override_num_blocks=len(files)).flat_map(
        read_rows, fn_kwargs={"columns": job.columns, "storage_options": url_options(job.source, job.storage_options)}
    ).materialize()
    checked = rows.select_columns(["file", "row", "id", "digest", "problem"]).iter_rows()
    repeats = repeated_ids(checked)
    # One block per actor batch: the pool spreads blocks, so a corpus in one file still keeps every actor busy.
    # Split before the pool starts: the split's tasks need CPUs that the pool's idle actors would hold.
    rows = rows.repartition(max(1, math.ceil(rows.count() / job.rows_per_batch))).materialize()
    stored = rows.map_batches(
        mark_repeats, fn_kwargs={"repeats": repeats}, batch_format="pyarrow"
    ).map_batches(
        ChunkKVActor,
        fn_constructor_kwargs={"config": config_to_dict(config), "dtype": dtype, "tenant": job.tenant,
                               "rule": str(job.rule), "num_threads": job.threads_per_actor},
        compute=ray.data.ActorPoolStrategy(size=pool.num_actors),
        num_cpus=pool.num_cpus,
        num_gpus=pool.num_gpus,
        batch_size=job.rows_per_batch,
        batch_format="pyarrow",
    )
    batches = list(stored.iter_batches(batch_format="pyarrow", batch_size=None))
    results = pa.concat_tables([b.cast(RESULT_SCHEMA) for b in batches]) if batches else RESULT_SCHEMA.empty_table()
    manifest = manifest_table(results)
    refusals = refusal_rows(results)
    write_manifest(manifest, job.manifest_url, url_options(job.manifest_url, job.storage_options))
    write_refusals(refusals, job.refusals_url, url_options(job.refusals_url, job.storage_options))
    return summarize(manifest, len(refusals), len(files), time.monotonic() - start_s)


def write_manifest(manifest: pa.Table, url: str, storage_options: Mapping[str, Any]) -> None:
    """The manifest as one Parquet file."""
    with fsspec.open(url, "wb", **storage_options) as handle:
        pq.write_table(manifest, handle)


def write_refusals(refusals: list[dict[str, Any]], url: str, storage_options: Mapping[str, Any]) -> None:
    """One JSON line per refused row or file (an empty file when nothing was refused)."""
    with fsspec.open(url, "w", **storage_options) as handle:
        handle.writelines(json.dumps(row) + "\n" for row in refusals)
