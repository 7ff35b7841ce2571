"""Command-line arguments the per-record quality benches share (bench/): which records, engine and dtype."""
import argparse
from pathlib import Path

from workers.evaluation.engines import ENGINE_KINDS
from workers.model.dtype import AUTO, DTYPE_CHOICES

MUSIQUE = Path("../shared/data/musique_cacheblend.dev.jsonl")


def add_record_arguments(parser: argparse.ArgumentParser, data: Path = MUSIQUE, limit: int = 100) -> None:
    """--data, --limit, --offset (records), --engine (default vllm) and --dtype."""
    parser.add_argument("--data", type=Path, default=data)
    parser.add_argument("--limit", type=int, default=limit)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--engine", choices=ENGINE_KINDS, default="vllm")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO)
