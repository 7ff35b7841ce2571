"""Where cacheblend's and query_driven's fusion time goes in the vLLM engine: per selective layer, the queries
recomputed, their runs of consecutive positions, where the runs end, and the layer's attention + MLP time.

Runs bench/frontier.py's evaluation (rows to --rows) with the engine runner's `attend_and_mlp` and each mode's
`prefill` timed (class attributes wrapped for this process only), then prints one line per mode and ratio.
Layers with fewer than --full-above queries count as selective (cacheblend's layers 0-1 compute every token).
"""
import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from workers.fusion.cacheblend import CacheBlend
from workers.fusion.query_driven import QueryDriven
from workers.vllm.module_runner import VLLMModuleRunner
from workers.vllm.paged_attention import query_runs

LAYERS: dict[str, list[tuple[int, int, float, float]]] = defaultdict(list)  # label -> (queries, runs, end, s)
PREFILLS: dict[str, list[float]] = defaultdict(list)
_current = ["?"]


def _timed_layer(original: Any) -> Any:
    def attend_and_mlp(self: VLLMModuleRunner, layer: int, h: Any, q: Any, positions: Any, cache: Any) -> Any:
        start = time.perf_counter()
        out = original(self, layer, h, q, positions, cache)
        _, ends = query_runs(positions)
        LAYERS[_current[0]].append((len(positions), len(ends), float(ends.float().mean()), time.perf_counter() - start))
        return out
    return attend_and_mlp


def _timed_prefill(name: str, original: Any) -> Any:
    def prefill(self: Any, runner: Any, layout: Any, cache: Any, ratio: float, feed: Any = None) -> Any:
        _current[0] = f"{name}@{ratio:g}"
        start = time.perf_counter()
        result = original(self, runner, layout, cache, ratio, feed)
        PREFILLS[_current[0]].append(time.perf_counter() - start)
        _current[0] = "?"
        return result
    return prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/musique_cacheblend.dev.jsonl"))
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--offset", type=int, default=40)
    parser.add_argument("--ratios", default="0.05,0.15")
    parser.add_argument("--full-above", type=int, default=3000)
    parser.add_argument("--rows", type=Path, required=True)
    args = parser.parse_args()
    VLLMModuleRunner.attend_and_mlp = _timed_layer(VLLMModuleRunner.attend_and_mlp)
    CacheBlend.prefill = _timed_prefill("cacheblend", CacheBlend.prefill)
    QueryDriven.prefill = _timed_prefill("query_driven", QueryDriven.prefill)
    sys.argv = ["frontier", "--data", str(args.data), "--limit", str(args.limit), "--offset", str(args.offset),
                "--engine", "vllm", "--modes", "cacheblend,query_driven", "--ratios", args.ratios,
                "--max-new-tokens", "2", "--rows", str(args.rows), "--out", str(args.rows.with_suffix(".json"))]
    sys.path.insert(0, str(Path(__file__).parent))
    import frontier

    frontier.main()
    for label in sorted(PREFILLS):
        selective = [row for row in LAYERS[label] if row[0] < args.full_above]
        queries, runs, ends, seconds = (statistics.fmean(row[i] for row in selective) for i in range(4))
        print(f"{label}: fusion {statistics.median(PREFILLS[label]):.3f} s median over {len(PREFILLS[label])}; "
              f"{len(selective)} selective layers: {queries:.0f} queries in {runs:.1f} runs ending at {ends:.0f} "
              f"on average, {1000 * seconds:.1f} ms a layer")

if __name__ == "__main__":
    main()
