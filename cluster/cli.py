"""The `blendserve` command line."""
import json
from pathlib import Path

import typer

app = typer.Typer(help="blendserve: RAG serving with CacheBlend chunk-KV fusion.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks; results go to JSON files.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("store")
def bench_store(
    tiers: str = typer.Option("ram,ssd,s3", help="Comma-separated tiers to measure."),
    size_mb: int = typer.Option(64, help="Bytes of chunk KV written and read per tier, in MiB."),
    out: Path = typer.Option(Path("store-bench.json"), help="Where to write the JSON result."),
) -> None:
    """Measure put/get throughput and per-layer read latency of the kvplane tiers."""
    from kvplane.bench import run_store_benchmark

    result = run_store_benchmark([t.strip() for t in tiers.split(",") if t.strip()], size_mb, out)
    typer.echo(json.dumps(result, indent=2))
