"""The `blendserve` command line."""
import json
import logging
from pathlib import Path

import typer

app = typer.Typer(help="blendserve: RAG serving with CacheBlend chunk-KV fusion.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks; results go to JSON files.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
log = logging.getLogger("blendserve")
DTYPE_HELP = "auto (bf16 on CPUs with native bf16, else float32; the model's own on GPU), bfloat16, float16 or float32."


@app.command("prepare-model")
def prepare_model(cache_dir: Path = typer.Option(None, help="Where prepared checkpoints live.")) -> None:
    """Convert the default model (SmolLM2-135M-Instruct GGUF) to a bf16 safetensors checkpoint, once."""
    from workers.default_model import prepare_default_model

    typer.echo(str(prepare_default_model(cache_dir)))


@app.command("serve")
def serve_command(
    config: Path = typer.Option(None, exists=True, dir_okay=False, help="A YAML configuration (default: none)."),
    dtype: str = typer.Option(None, help=DTYPE_HELP + " Overrides the configuration's model.dtype."),
) -> None:
    """Serve the HTTP API (OpenAI-compatible + documents) on Ray Serve until interrupted."""
    from cluster.config import ConfigError, config_from_dict, config_to_dict, load_config
    from cluster.auth import AuthConfigError
    from cluster.server import run_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        serve_config = load_config(config)
        if dtype is not None:
            document = config_to_dict(serve_config)
            serve_config = config_from_dict({**document, "model": {**document["model"], "dtype": dtype}}, "--dtype")
    except ConfigError as error:
        raise typer.BadParameter(str(error), param_hint="--dtype" if dtype is not None else "--config") from None
    log.info("blendserve: serving %s on http://%s:%d", serve_config.model.served_name,
             serve_config.server.host, serve_config.server.port)
    try:
        run_server(serve_config)
    except AuthConfigError as error:
        raise typer.BadParameter(str(error), param_hint="--config") from None


@app.command("eval")
def eval_command(
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="A QA file in the shared JSONL schema."),
    limit: int = typer.Option(None, min=1, help="Evaluate only N records."),
    offset: int = typer.Option(0, min=0, help="Skip this many records first."),
    modes: str = typer.Option("full_prefill,full_reuse,cacheblend", help="Comma-separated fusion modes."),
    ratio: float = typer.Option(0.15, min=0.0, max=1.0, help="Recompute ratio for the selective modes."),
    out: Path = typer.Option(Path("eval.json"), help="Where to write the JSON result."),
    model: Path = typer.Option(None, help="A local Hugging Face checkpoint directory (default: SmolLM2-135M)."),
    max_new_tokens: int = typer.Option(32, min=1, help="Greedy tokens generated per answer."),
    chunk_context: str = typer.Option("prefix", help="Compute chunk KV 'alone' or after the prompt 'prefix'."),
    selection_span_tokens: int = typer.Option(16, min=1, help="cacheblend's span of recomputed tokens (1: single)."),
    gradual_filtering: bool = typer.Option(
        False, help="cacheblend narrows at layers 1 and 2 (2r, then r), as in the paper, instead of once at layer 1."
    ),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
) -> None:
    """Compare fusion modes on quality (F1, agreement with full prefill, first-token KL) and TTFT."""
    from workers.evaluation.dataset import load_records
    from workers.evaluation.evaluate import EvalRun, evaluate
    from workers.evaluation.report import eval_document, format_table
    from workers.fusion.base import FusionOptions
    from workers.torch_engine import load_torch_engine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    mode_names = [m.strip() for m in modes.split(",") if m.strip()]
    options = FusionOptions(recompute_ratio=ratio, selection_span_tokens=selection_span_tokens)
    if gradual_filtering:
        options = options.with_gradual_filtering()
    try:
        engine = load_torch_engine(model, dtype, options, chunk_context)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--dtype") from None
    unknown = [m for m in mode_names if m not in engine.fuser.modes]
    if unknown:
        raise typer.BadParameter(f"unknown mode(s) {unknown}; choose from {sorted(engine.fuser.modes)}", param_hint="--modes")
    records = load_records(data, limit, offset)
    runs = [EvalRun(m, m, ratio) for m in dict.fromkeys(["full_prefill", *mode_names])]
    summaries, precompute_s = evaluate(
        engine, records, runs, max_new_tokens, lambda i, s: log.info("record %d/%d done", i + 1, len(records))
    )
    document = eval_document(engine.fuser.runner.checkpoint.path.name, data, len(records), summaries, engine.dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    typer.echo(format_table(summaries))
    typer.echo(f"chunk KV precompute (not in TTFT): {precompute_s:.1f} s for {len(records)} records")

@bench_app.command("serve")
def bench_serve(
    workload: Path = typer.Option(..., exists=True, dir_okay=False, help="A workload JSONL (bench/workloads.py)."),
    out: Path = typer.Option(Path("bench-serve.json"), help="Where to write the run's JSON result."),
    systems: str = typer.Option("blendserve,vllm", help="Systems to run, one at a time: blendserve, vllm."),
    num_requests: int = typer.Option(None, min=1, help="Requests of the workload to send (default: all)."),
    offset: int = typer.Option(0, min=0, help="Skip this many workload requests first."),
    rate: str = typer.Option("inf", help="Requests/s, comma-separated for several load points (inf: at once)."),
    concurrency: int = typer.Option(None, min=1, help="Requests in flight at most (instead of pacing by rate)."),
    burstiness: float = typer.Option(1.0, min=0.01, help="Gamma arrivals' shape; 1 is Poisson (vLLM's definition)."),
    max_tokens: int = typer.Option(32, min=1, help="Tokens generated per answer (greedy, both systems)."),
    precompute: bool = typer.Option(False, help="Store every workload document in blendserve before timing."),
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

    from cluster.bench_serve import BenchPlan, LoadPoint, run_benchmark
    from cluster.bench_systems import EngineShape
    from cluster.bench_workload import read_workload
    from workers.default_model import prepare_default_model
    from workers.dtype import resolve_dtype

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    rates = [math.inf if r.strip() == "inf" else float(r) for r in rate.split(",") if r.strip()]
    points = tuple(LoadPoint(concurrency=concurrency) for _ in rates[:1]) if concurrency else \
        tuple(LoadPoint(rate_rps=r) for r in rates)
    model_path = model or prepare_default_model()
    base = yaml.safe_load(config.read_text()) if config else {}
    served_name = (base.get("model") or {}).get("name") or (
        "SmolLM2-135M-Instruct" if model is None else model_path.name)
    try:
        shape = EngineShape(model_path, served_name, resolve_dtype(dtype, model_path), max_model_len,
                            kv_cache_mib << 20, max_num_seqs)
        plan = BenchPlan(
            tuple(read_workload(workload, num_requests, offset)), points, shape,
            work_dir or out.with_suffix(".work"), tuple(s.strip() for s in systems.split(",") if s.strip()),
            max_tokens, burstiness, precompute, warmup,
            {k: v for k, v in {"mode": mode, "recompute_ratio": ratio}.items() if v is not None}, base, seed,
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
