"""Ingest on a real local Ray with Ray Data, the real model and a real S3 endpoint (moto): what it stores, what it
refuses, that a rerun computes nothing, and that a run stopped with Ctrl-C and run again ends as one that was not."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from cluster.config import ServeConfig, config_from_dict
from cluster.ingest.pipeline import IngestJob, run_ingest
from cluster.ingest.table import DocumentTable, TableLocation
from kvplane.store import TieredStore
from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options
from kvplane.tiers.spec import TierSpec
from tests.local_ray import local_ray
from workers.chunks.kvplane_store import KVPlaneChunkStore
from workers.fuser import Fuser
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.runner import ModelRunner

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "hotpotqa_hipporag.dev.jsonl"
BUCKET = "kvcache"
TENANT = "acme"
STOP_TIMEOUT_S = 120


def passages(count: int) -> list[str]:
    """Distinct short real passages."""
    texts: list[str] = []
    with open(DATA) as handle:
        for line in handle:
            texts += [c["text"] for c in json.loads(line)["ctxs"] if c["text"] not in texts]
            if len(texts) >= count:
                return texts[:count]
    raise AssertionError("not enough passages")


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with LocalS3() as endpoint_url:
        create_bucket(endpoint_url, BUCKET)
        yield endpoint_url


@pytest.fixture(scope="module")
def ray_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="ing-"))  # Ray's socket paths must fit 107 bytes
    with local_ray(root, num_cpus=2, object_store_bytes=150 << 20):
        yield root


def s3_config(root: Path, endpoint_url: str, prefix: str) -> ServeConfig:
    """The shard in RAM and the object tier in S3, float32 (KV compared tightly), the torch engine."""
    tiers = [{"name": "ram", "url": "ram://", "capacity_bytes": 256 << 20},
             {"name": "object", "url": f"s3://{BUCKET}/{prefix}", "capacity_bytes": 1 << 30,
              "storage_options": s3_storage_options(endpoint_url)}]
    return config_from_dict({"data_dir": str(root / prefix), "tiers": tiers, "engine": {"kind": "torch"},
                             "model": {"dtype": "float32"}})


def write_corpus(url: str, storage_options: dict[str, Any], texts: list[str]) -> None:
    """16 good JSONL rows and 4 bad ones, 6 Parquet rows, one file that is no Parquet."""
    rows = [json.dumps({"id": f"doc-{i}", "text": t}).encode() for i, t in enumerate(texts[:16])]
    rows += [b'{"id": "empty", "text": ""}', b'{"id": "bad", "text": "caf\xe9"}',
             json.dumps({"id": "doc-3", "text": "Another text under a taken id."}).encode(),
             json.dumps({"id": "huge", "text": "word " * 9000}).encode()]
    fs, root = fsspec.core.url_to_fs(url, **storage_options)
    fs.pipe_file(f"{root}/a.jsonl", b"\n".join(rows) + b"\n")
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": [f"p-{i}" for i in range(6)], "text": texts[16:22]}), sink)
    fs.pipe_file(f"{root}/b.parquet", sink.getvalue().to_pybytes())
    fs.pipe_file(f"{root}/c.parquet", b"not a parquet file")


def reference_fuser(config: ServeConfig) -> Fuser:
    """What a serving worker's POST /v1/documents runs, on a store of its own."""
    runner = ModelRunner(load_checkpoint(prepare_default_model(), torch.float32))
    store = KVPlaneChunkStore(TieredStore.from_specs([TierSpec("ram", "ram://", 1 << 30)]),
                              runner.checkpoint.fingerprint)
    return Fuser(runner, store=store, template=config.prompt.template(runner.checkpoint.tokenizer),
                 chunk_context=config.engine.chunk_context)


def manifest_rows(url: str, storage_options: dict[str, Any] | None = None) -> list[tuple[str, str, int]]:
    with fsspec.open(url, "rb", **(storage_options or {})) as handle:
        table = pq.read_table(handle)
    return list(zip(table["id"].to_pylist(), table["key"].to_pylist(), table["num_tokens"].to_pylist()))


@pytest.mark.slow  # 77 s on AVX2; tests/cluster/test_serving.py ingests on the app's Ray by default
def test_a_corpus_in_s3_is_stored_as_post_documents_would_and_a_rerun_computes_nothing(
    ray_root: Path, s3: str, tmp_path: Path
) -> None:
    config = s3_config(ray_root, s3, "e2e")
    options = s3_storage_options(s3)
    texts = passages(22)
    write_corpus(f"s3://{BUCKET}/corpus", options, texts)
    job = IngestJob(f"s3://{BUCKET}/corpus", f"s3://{BUCKET}/out/manifest.parquet", str(tmp_path / "refused.jsonl"),
                    tenant=TENANT, rows_per_batch=4, storage_options={"s3": options})
    summary = run_ingest(config, job)
    assert (summary.num_files, summary.num_documents, summary.num_chunks) == (3, 22, 22)
    assert (summary.num_computed_chunks, summary.num_skipped_chunks, summary.num_refused) == (22, 0, 5)
    assert set(summary.bytes_by_tier) >= {"object"} and summary.tokens_per_s > 0
    refused = [json.loads(line) for line in (tmp_path / "refused.jsonl").read_text().splitlines()]
    a, c = f"s3://{BUCKET}/corpus/a.jsonl", f"s3://{BUCKET}/corpus/c.parquet"
    assert [(r["file"], r["row"], r["id"]) for r in refused] == [
        (a, 17, "empty"), (a, 18, ""), (a, 19, "doc-3"), (a, 20, "huge"), (c, 0, "")]
    assert refused[0]["problem"] == "has no text" and refused[1]["problem"] == "not UTF-8 (byte 26)"
    assert refused[2]["problem"] == "id 'doc-3' repeats " + a + " row 4 (another text)"
    assert "exceed the model's context of 8192" in refused[3]["problem"]
    assert refused[4]["problem"].startswith("unreadable: ")

    manifest = manifest_rows(job.manifest_url, options)
    ids = [doc_id for doc_id, _, _ in manifest]
    assert ids == [f"doc-{i}" for i in range(16)] + [f"p-{i}" for i in range(6)]
    table = DocumentTable(TableLocation.of(config))
    assert table.get(TENANT, "doc-3").text == texts[3] and table.get(TENANT, "huge") is None

    # The same key and KV as a worker's POST /v1/documents gives the same text (float32: rounding only).
    fuser = reference_fuser(config)
    picked = [0, 7, 15]
    stored = fuser.store_documents([texts[i] for i in picked], TENANT)
    assert [chunk.key for chunk in stored] == [manifest[i][1] for i in picked]
    shared = TieredStore.from_specs([config.tier("object").to_spec()])
    for chunk in stored:
        ingested = shared.get(chunk.key)
        torch.testing.assert_close(ingested.kv, fuser.store.tiered.get(chunk.key).kv, atol=2e-3, rtol=1e-4)

    again = run_ingest(config, job)
    assert (again.num_computed_chunks, again.num_skipped_chunks, again.num_refused) == (0, 22, 5)
    assert manifest_rows(job.manifest_url, options) == manifest


@pytest.mark.slow  # two CLI runs, each starting Ray; tests/cluster/test_serving.py ingests on the app's Ray by default
def test_a_run_stopped_with_ctrl_c_and_run_again_ends_as_an_uninterrupted_run(ray_root: Path, tmp_path: Path) -> None:
    texts = passages(24)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    settings = {"engine": {"kind": "torch"}, "model": {"dtype": "float32"}}
    reference = tmp_path / "reference.parquet"
    config = config_from_dict({**settings, "data_dir": str(ray_root / "reference")})
    run_ingest(config, IngestJob(str(corpus), str(reference), str(tmp_path / "r.jsonl"), tenant=TENANT))

    data_dir = tmp_path / "data"
    config_file = tmp_path / "serve.yaml"
    config_file.write_text(yaml.safe_dump({**settings, "data_dir": str(data_dir)}))
    manifest = tmp_path / "manifest.parquet"
    args = [sys.executable, "-c", "from cluster.cli import app; app()", "ingest", str(corpus), "--tenant", TENANT,
            "--config", str(config_file), "--manifest", str(manifest), "--refusals", str(tmp_path / "refused.jsonl"),
            "--actors", "1", "--rows-per-batch", "2", "--summary", str(tmp_path / "summary.json")]
    records = data_dir / "documents" / f"t-{TENANT}"
    stopped = _run_until(args, lambda: len(list(records.glob("*.json"))) >= 6 if records.exists() else False)
    assert stopped and not manifest.exists()  # stopped in the middle: no manifest yet
    done_before = len(list(records.glob("*.json")))
    assert 6 <= done_before < len(texts)
    assert _run_until(args, lambda: False) is False  # this time to the end
    assert manifest_rows(str(manifest)) == manifest_rows(str(reference))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_chunks"] == len(texts) and summary["num_refused"] == 0
    assert summary["num_skipped_chunks"] > 0  # what the stopped run stored is not computed again


def _run_until(args: list[str], stop_when: Any) -> bool:
    """Run the CLI in a session of its own until it ends (False) or `stop_when()` holds and Ctrl-C stops it (True)."""
    root = tempfile.mkdtemp(dir="/tmp", prefix="ingc-")
    env = {**os.environ, "RAY_TMPDIR": root, "TMPDIR": root, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    env.pop("RAY_ADDRESS", None)
    log = Path(root) / "ingest.log"  # a file, not a pipe: Ray Data's progress bars would fill a pipe and block
    process = subprocess.Popen(args, env=env, start_new_session=True, stdout=log.open("w"), stderr=subprocess.STDOUT)
    stopped = False
    try:
        deadline = time.monotonic() + 600
        while process.poll() is None and time.monotonic() < deadline:
            if not stopped and stop_when():
                process.send_signal(signal.SIGINT)
                stopped = True
                process.wait(STOP_TIMEOUT_S)
            time.sleep(0.2)
        if not stopped:
            assert process.wait(1) == 0, log.read_text()[-3000:]
        return stopped
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever of its Ray is left
        except ProcessLookupError:
            pass
        process.wait()
