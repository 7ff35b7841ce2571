"""The `blendserve` command line."""
import json
import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from workers.chunks.sources import CHUNK_CONTEXTS, DEFAULT_CHUNK_CONTEXT

if TYPE_CHECKING:  # annotations only: the configuration loads when a command runs
    from cluster.config import ServeConfig

app = typer.Typer(help="blendserve: RAG serving with CacheBlend chunk-KV fusion.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks; results go to JSON files.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
log = logging.getLogger("blendserve")
DTYPE_HELP = "auto (bf16 on CPUs with native bf16, else float32; the model's own on GPU), bfloat16, float16 or float32."


def _serve_config(path: Path | None, dtype: str | None) -> "ServeConfig":
    """The configuration in `path` (or the defaults), its model.dtype replaced by `dtype` when given."""
    from cluster.config import ConfigError, config_from_dict, config_to_dict, load_config

    try:
        serve_config = load_config(path)
        if dtype is not None:
            document = config_to_dict(serve_config)
            serve_config = config_from_dict({**document, "model": {**document["model"], "dtype": dtype}}, "--dtype")
    except ConfigError as error:
        raise typer.BadParameter(str(error), param_hint="--dtype" if dtype is not None else "--config") from None
    return serve_config


@app.command("prepare-model")
def prepare_model(
    cache_dir: Path = typer.Option(None, help="Where prepared checkpoints live."),
    model: str = typer.Option("smollm2-135m", help="smollm2-135m (the default model) or gemma3-270m."),
) -> None:
    """Convert a known model's GGUF to a bf16 safetensors checkpoint, once; prints the checkpoint's directory."""
    from workers.model.prepared import PREPARERS

    if model not in PREPARERS:
        raise typer.BadParameter(f"choose from {', '.join(PREPARERS)}", param_hint="--model")
    typer.echo(str(PREPARERS[model](cache_dir)))


@app.command("fetch-model")
def fetch_model_command(
    source: str = typer.Argument(..., metavar="SOURCE", help="s3://bucket/prefix, file:///dir or a dir."),
    dest: Path = typer.Argument(..., metavar="DEST", help="The local copy (what it held is replaced)."),
    endpoint_url: str = typer.Option(None, help="An S3-compatible endpoint, e.g. http://minio:9000 (default: AWS)."),
    region: str = typer.Option(None, help="The bucket's S3 region (default: AWS_REGION or botocore's)."),
) -> None:
    """Copy a checkpoint directory (config.json, weights, tokenizer) into DEST unless it already holds it; prints DEST.

    S3 credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...). The Helm chart runs
    this in an init container before Ray starts.
    """
    from workers.model.fetch import FetchError, fetch_model

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        result = fetch_model(source, dest, endpoint_url, region)
    except FetchError as error:
        typer.echo(f"fetch-model: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(str(result.dest))


@app.command("serve")
def serve_command(
    config: Path = typer.Option(None, exists=True, dir_okay=False, help="A YAML configuration (default: none)."),
    dtype: str = typer.Option(None, help=DTYPE_HELP + " Overrides the configuration's model.dtype."),
) -> None:
    """Serve the HTTP API (OpenAI-compatible + documents) on Ray Serve until interrupted."""
    from cluster.api.auth import AuthConfigError
    from cluster.server import run_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    serve_config = _serve_config(config, dtype)
    log.info("blendserve: serving %s on http://%s:%d", serve_config.model.served_name,
             serve_config.server.host, serve_config.server.port)
    try:
        run_server(serve_config)
    except AuthConfigError as error:
        raise typer.BadParameter(str(error), param_hint="--config") from None


@app.command("ingest")
def ingest_command(
    source: str = typer.Argument(..., metavar="SOURCE", help="A Parquet, JSONL or CSV file or folder, local or s3://."),
    id_column: str = typer.Option("id", help="The column of each row's document id (URL-safe)."),
    text_column: str = typer.Option("text", help="The column of each row's text."),
    tenant: str = typer.Option(None, help="The tenant whose chunks these are (default: server.default_tenant)."),
    chunk: str = typer.Option("row", help="row (one row = one chunk) or tokens:N (split to at most N tokens, "
                              "ids ID.0, ID.1, ...)."),
    manifest: str = typer.Option("ingest-manifest.parquet", help="Where the manifest goes (Parquet; local or s3://)."),
    refusals: str = typer.Option("ingest-refusals.jsonl", help="Where refused rows go, with file and row."),
    summary: Path = typer.Option(None, help="Also write the summary here (JSON)."),
    config: Path = typer.Option(None, exists=True, dir_okay=False, help="The serving configuration (default: none)."),
    dtype: str = typer.Option(None, help=DTYPE_HELP + " Overrides the configuration's model.dtype."),
    address: str = typer.Option(None, help="A running Ray cluster (auto, or host:port); default: a local Ray."),
    actors: int = typer.Option(None, min=1, help="Chunk-KV actors (default: one per GPU, else per free CPUs)."),
    threads_per_actor: int = typer.Option(1, min=1, help="CPUs (torch threads) each actor takes."),
    rows_per_batch: int = typer.Option(32, min=1, help="Rows an actor takes at once."),
) -> None:
    """Compute and store the chunk KV of a corpus across the Ray cluster, with a manifest of what was stored."""
    import ray

    from cluster.ingest.chunking import ChunkRule
    from cluster.ingest.pipeline import IngestJob, run_ingest
    from cluster.ingest.source import Columns

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    serve_config = _serve_config(config, dtype)
    shared = serve_config.tier("object")  # its storage options (an S3 endpoint, keys) serve its scheme's URLs
    options = {} if shared is None else {shared.url.split("://", 1)[0]: dict(shared.storage_options)}
    try:
        job = IngestJob(source, manifest, refusals, Columns(id_column, text_column),
                        tenant or serve_config.server.default_tenant, ChunkRule.parse(chunk), actors,
                        threads_per_actor, rows_per_batch, options)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    ray.init(address=address)
    try:
        result = run_ingest(serve_config, job)
    except (FileNotFoundError, ValueError) as error:
        typer.echo(f"ingest: {error}", err=True)
        raise typer.Exit(1) from None
    finally:
        ray.shutdown()
    document = result.as_dict()
    if summary is not None:
        summary.write_text(json.dumps(document, indent=2) + "\n")
    typer.echo(f"ingest: {result.num_documents} documents, {result.num_chunks} chunks, {result.num_tokens} tokens "
               f"({result.num_computed_chunks} computed, {result.num_skipped_chunks} already stored), "
               f"{result.num_refused} refused (see {refusals}); {document['tokens_per_s']} tokens/s; "
               f"bytes by tier {result.bytes_by_tier}")


@app.command("eval")
def eval_command(
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="A QA file in the shared JSONL schema."),
    limit: int = typer.Option(None, min=1, help="Evaluate only N records."),
    offset: int = typer.Option(0, min=0, help="Skip this many records first."),
    modes: str = typer.Option("full_prefill,full_reuse,cacheblend", help="Comma-separated fusion modes."),
    ratio: float = typer.Option(None, min=0.0, max=1.0, help="One recompute ratio (default: the configured one)."),
    ratios: str = typer.Option(None, help="Comma-separated ratios: each mode runs at each (labels MODE@RATIO)."),
    engine: str = typer.Option("torch", help="torch (blendserve's runner decodes) or vllm (vLLM prefills the "
                               "question and decodes)."),
    out: Path = typer.Option(Path("eval.json"), help="Where to write the JSON result."),
    records_out: Path = typer.Option(None, help="Also write every record's scores here (JSON lines)."),
    model: Path = typer.Option(None, help="A local Hugging Face checkpoint directory (default: SmolLM2-135M)."),
    max_new_tokens: int = typer.Option(32, min=1, help="Greedy tokens generated per answer."),
    teacher_forced: bool = typer.Option(True, help="Also measure KL and NLL gap along the full-prefill answer."),
    chunk_context: str = typer.Option(
        DEFAULT_CHUNK_CONTEXT, help=f"What chunk KV is computed after: one of {CHUNK_CONTEXTS} (docs/configuration.md)."
    ),
    selection_span_tokens: int = typer.Option(16, min=1, help="Span of recomputed tokens (1: single tokens)."),
    gradual_filtering: bool = typer.Option(
        False, help="cacheblend narrows at layers 1 and 2 (2r, then r), as in the paper, instead of once at layer 1."
    ),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    system_prompt: str = typer.Option(None, help="Ask each record as a chat with this system message."),
    earlier_turns: int = typer.Option(0, min=0, help="Ask each record after N earlier exchanges (the records "
                                      "before it: question, first gold answer)."),
    documents_at: str = typer.Option("last", help="A chat's documents before its last question (last) or before the "
                                     "conversation (start)."),
    chunks_after: str = typer.Option("default_prefix", help="A chat's chunk KV is computed after the default "
                                     "prefix or the request's own (request_prefix)."),
    resume: bool = typer.Option(False, help="Keep the rows already in --records-out and score only the records "
                                "missing there (an interrupted run goes on)."),
    kv_compressions: str = typer.Option("none", help="Comma-separated compressions of chunk KV (none, int8, int4): "
                                        "each mode also runs reading chunk KV as a tier so compressed serves it "
                                        "(labels MODE+COMPRESSION)."),
) -> None:
    """Compare fusion modes on agreement with full prefill (F1, exact match, first token, teacher-forced KL)
    and TTFT; every quality figure with a 95% bootstrap interval over records."""
    from kvplane.compression.registry import compression
    from workers.evaluation.dataset import in_conversation, load_records
    from workers.evaluation.engines import ENGINE_KINDS, load_eval_engine
    from workers.evaluation.evaluate import (
        REFERENCE_MODE,
        EvalRun,
        evaluate,
        pending_records,
        read_rows,
        score_row,
        summarise,
    )
    from workers.evaluation.report import eval_document, format_table
    from workers.fusion.base import FusionOptions
    from workers.generation.conversation import CHUNK_CONTEXTS_WITH_SYSTEM

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if engine not in ENGINE_KINDS:
        raise typer.BadParameter(f"choose from {ENGINE_KINDS}", param_hint="--engine")
    if chunks_after not in CHUNK_CONTEXTS_WITH_SYSTEM:
        raise typer.BadParameter(f"choose from {CHUNK_CONTEXTS_WITH_SYSTEM}", param_hint="--chunks-after")
    mode_names = list(dict.fromkeys(m.strip() for m in modes.split(",") if m.strip()))
    options = FusionOptions(selection_span_tokens=selection_span_tokens)
    chosen = [float(r) for r in ratios.split(",")] if ratios else [options.recompute_ratio if ratio is None else ratio]
    if gradual_filtering:
        options = options.with_gradual_filtering()
    try:
        packings = [compression(name.strip()).name for name in kv_compressions.split(",") if name.strip()]
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--kv-compressions") from None
    try:
        access = load_eval_engine(engine, model, dtype, options, chunk_context, chunks_after=chunks_after,
                                  kv_compressions=packings)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--dtype") from None
    unknown = [m for m in mode_names if m not in access.engine.fuser.modes]
    if unknown:
        raise typer.BadParameter(f"unknown mode(s) {unknown}; choose from {sorted(access.engine.fuser.modes)}",
                                 param_hint="--modes")
    runs = [EvalRun(REFERENCE_MODE, REFERENCE_MODE, 1.0)]
    for name in (m for m in mode_names if m != REFERENCE_MODE):
        for r in chosen:
            label = name if len(chosen) == 1 else f"{name}@{r:g}"
            runs += [EvalRun(label if p == "none" else f"{label}+{p}", name, r, p) for p in packings]
    records = load_records(data, limit, offset)
    if system_prompt is not None or earlier_turns:
        try:
            records = in_conversation(records, system_prompt, earlier_turns, documents_at)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--earlier-turns/--documents-at") from None
    if resume and records_out is None:
        raise typer.BadParameter("--resume needs --records-out: the rows to go on from", param_hint="--resume")
    labels = [run.label for run in runs]
    wanted = {record.id for record in records}
    done = [row for row in read_rows(records_out) if row.label in labels and row.record in wanted] if resume else []
    pending = pending_records(records, done, labels)
    if done:
        log.info("resuming: %d of %d records already scored in %s", len(records) - len(pending), len(records),
                 records_out)
    rows_file = records_out.open("a" if resume else "w") if records_out is not None else None

    def on_record(index: int, rows: list) -> None:
        if rows_file is not None:
            rows_file.writelines(json.dumps(score_row(row)) + "\n" for row in rows)
            rows_file.flush()
        log.info("record %d/%d done", index + 1, len(pending))

    try:
        scores, store_s = evaluate(access, pending, runs, max_new_tokens, teacher_forced, on_record)
    finally:
        if rows_file is not None:
            rows_file.close()
        access.engine.close()
    finished = {record for record, count in Counter(row.record for row in done).items() if count >= len(labels)}
    scores = [row for row in done if row.record in finished] + scores
    summaries = summarise(scores, runs)
    name = access.engine.fuser.runner.checkpoint.path.name
    document = eval_document(name, engine, data, len(records), summaries, access.engine.dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    typer.echo(format_table(summaries))
    typer.echo(f"chunk KV stored before timing (not in TTFT): {store_s:.1f} s for {len(records)} records")


@bench_app.command("serve")
def bench_serve(
    workload: Path = typer.Option(..., exists=True, dir_okay=False, help="A workload JSONL (bench/workloads.py)."),
    out: Path = typer.Option(Path("bench-serve.json"), help="Where to write the run's JSON result."),
    systems: str = typer.Option("blendserve,vllm", help="Systems to run, one at a time: blendserve, vllm."),
    num_requests: int = typer.Option(None, min=1, help="Requests of the workload to send (default: all)."),
    offset: int = typer.Option(0, min=0, help="Skip this many workload requests first."),
    rate: str = typer.Option("inf", help="Requests/s, comma-separated for several load points (inf: at once)."),
    concurrency: str = typer.Option(
        None, help="Requests in flight at most, comma-separated for several load points (instead of --rate)."),
    burstiness: float = typer.Option(1.0, min=0.01, help="Gamma arrivals' shape; 1 is Poisson (vLLM's definition)."),
    max_tokens: int = typer.Option(32, min=1, help="Tokens generated per answer (greedy, both systems)."),
    precompute: bool = typer.Option(False, help="Store every workload document in blendserve before timing."),
    documents_by_id: bool = typer.Option(
        False, help="Ingest every workload document (`blendserve ingest`) before timing, then send ids, not text."),
    warmup: int = typer.Option(2, min=0, help="Untimed warm-up requests per system (on a passage of their own)."),
    mode: str = typer.Option(None, help="blendserve's fusion mode per request (default: the configuration's)."),
    ratio: float = typer.Option(None, min=0.0, max=1.0, help="blendserve's recompute ratio per request."),
    config: Path = typer.Option(None, exists=True, dir_okay=False, help="blendserve configuration to start from."),
    model: Path = typer.Option(None, help="A local checkpoint directory (default: SmolLM2-135M-Instruct)."),
    dtype: str = typer.Option("auto", help=DTYPE_HELP + " Both systems run the resolved dtype."),
    max_model_len: int = typer.Option(8192, min=256, help="Context per request, both systems."),
    kv_cache_mib: int = typer.Option(2048, min=1, help="vLLM KV cache per engine, both systems, in MiB."),
    max_num_seqs: int = typer.Option(8, min=1, help="Requests vLLM batches at once, both systems."),
    work_dir: Path = typer.Option(None, help="Logs, configs and Ray/vLLM files (default: next to --out)."),
    seed: int = typer.Option(0, help="Seed of the arrival process."),
) -> None:
    """Drive a workload over HTTP against blendserve and plain vLLM (prefix caching on), one after the other."""
    import math
    import shlex
    import sys

    import yaml

    from cluster.bench.serve import BenchPlan, LoadPoint, run_benchmark
    from cluster.bench.systems import EngineShape
    from cluster.bench.workload import read_workload
    from workers.model.default import prepare_default_model
    from workers.model.dtype import resolve_dtype

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    rates = [math.inf if r.strip() == "inf" else float(r) for r in rate.split(",") if r.strip()]
    try:
        limits = [int(c) for c in concurrency.split(",") if c.strip()] if concurrency else []
    except ValueError as error:
        raise typer.BadParameter(f"--concurrency takes integers, comma-separated: {error}") from error
    points = tuple(LoadPoint(concurrency=c) for c in limits) or tuple(LoadPoint(rate_rps=r) for r in rates)
    model_path = model or prepare_default_model()
    base = yaml.safe_load(config.read_text()) if config else {}
    served_name = (base.get("model") or {}).get("name") or (
        "SmolLM2-135M-Instruct" if model is None else model_path.name)
    try:
        shape = EngineShape(model_path, served_name, resolve_dtype(dtype, model_path), max_model_len,
                            kv_cache_mib << 20, max_num_seqs)
        plan = BenchPlan(
            requests=tuple(read_workload(workload, num_requests, offset)),
            points=points,
            shape=shape,
            work_dir=work_dir or out.with_suffix(".work"),
            systems=tuple(s.strip() for s in systems.split(",") if s.strip()),
            max_tokens=max_tokens,
            burstiness=burstiness,
            precompute=precompute,
            documents_by_id=documents_by_id,
            num_warmup=warmup,
            blend={k: v for k, v in {"mode": mode, "recompute_ratio": ratio}.items() if v is not None},
            blendserve_config=base,
            seed=seed,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    result = run_benchmark(plan, shlex.join(["blendserve", *sys.argv[1:]]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, system in result["systems"].items():
        for point in system["points"]:
            summary = point["summary"]
            typer.echo(f"{name} {point['load']}: ok {summary['num_ok']}/{summary['num_requests']}, "
                       f"TTFT {summary['ttft_s']}, {summary['throughput_req_s']} req/s")
    for row in result["comparison"]:
        typer.echo(json.dumps(row))
