"""The planner's measured curves per dtype, and where a blended request's TTFT goes, on the vLLM engine in process.

For each dtype: start the vLLM engine, calibrate the planner (plain prefill and cacheblend with every chunk cached,
`workers/engines/calibration.py`), then serve the first records of a workload blended with every chunk cached,
timing the fusion (on the engine thread) apart from the rest (hand-over, vLLM's prefill of the question, first
token). Writes one JSON.

    .venv/bin/python bench/planner_costs.py --workload docs/results/workloads/replay_musique.jsonl --records 6 \
        --dtypes bfloat16,float32 --out docs/results/planner/planner_costs.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from tempfile import TemporaryDirectory

from cluster.bench.serve import cpu_model
from cluster.bench.workload import read_workload
from workers.engines.base import BlendRequest
from workers.engines.calibration import calibrate_planner
from workers.generation.sampling import SamplingParams
from workers.model.default import prepare_default_model
from workers.model.dtype import measured_on
from workers.vllm.engine import VLLMEngine
from workers.vllm.settings import VLLMSettings

SIZES = (300, 600, 1200, 2400, 4800, 6000)


def measure(dtype: str, workload: Path, num_records: int, mode: str, ratio: float) -> dict[str, object]:
    """Calibrated curves and the TTFT split of `num_records` blended requests, for one dtype."""
    with TemporaryDirectory(prefix="bs-plan-") as scratch:
        engine = VLLMEngine.start(prepare_default_model(), Path(scratch), VLLMSettings(kv_cache_bytes=2 << 30), dtype)
        try:
            began = time.perf_counter()
            costs = calibrate_planner(engine, mode, ratio)
            calibration_s = time.perf_counter() - began
            records = read_workload(workload, num_records)
            for record in records:
                engine.store_documents(list(record.documents), "default")
            fuse_s: list[float] = []
            fuse = engine.fuser.fuse

            def timed_fuse(*args: object, **kwargs: object) -> object:
                start = time.perf_counter()
                try:
                    return fuse(*args, **kwargs)
                finally:
                    fuse_s.append(time.perf_counter() - start)

            engine.fuser.fuse = timed_fuse
            rows = []
            for record in records[:1] + records:  # the first one again first: a warm-up
                generation = engine.open(BlendRequest(list(record.documents), record.question, mode, ratio,
                                                      SamplingParams(max_new_tokens=1)))
                list(generation)
                stats = generation.stats
                rows.append({"prompt_tokens": stats.num_prompt_tokens, "ttft_s": round(stats.ttft_s, 4),
                             "fuse_s": round(fuse_s[-1], 4), "predicted_s": round(costs.blend_s(
                                 stats.num_prompt_tokens, 0), 4), "plain_predicted_s": round(
                                 costs.plain.predict_s(stats.num_prompt_tokens), 4)})
            rows = rows[1:]
        finally:
            engine.close()
    return {
        **measured_on(dtype),
        "calibration_s": round(calibration_s, 2),
        "plain": asdict(costs.plain),
        "blend": asdict(costs.blend),
        "predicted_s": {n: {"plain": round(costs.plain.predict_s(n), 4), "blend": round(costs.blend_s(n, 0), 4)}
                        for n in SIZES},
        "requests": rows,
        "median": {key: round(statistics.median(row[key] for row in rows), 4)
                   for key in ("ttft_s", "fuse_s", "predicted_s", "plain_predicted_s")},
    }


def _in_subprocess(dtype: str) -> dict[str, object]:
    """This script's measurement for one dtype, in a fresh process (vLLM's engine once per process)."""
    command = [sys.executable, *sys.argv, "--one-dtype", dtype]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--records", type=int, default=6)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--mode", default="cacheblend")
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--one-dtype", help=argparse.SUPPRESS)  # one engine per process: each dtype in its own
    args = parser.parse_args()
    if args.one_dtype:
        print(json.dumps(measure(args.one_dtype, args.workload, args.records, args.mode, args.ratio)))
        return
    result = {
        "command": "python bench/planner_costs.py " + " ".join(
            f"--{k} {v}" for k, v in vars(args).items() if k != "one_dtype"),
        "cpu_model": cpu_model(),
        "num_cpus": os.cpu_count(),
        "mode": args.mode,
        "ratio": args.ratio,
        "dtypes": {dtype: _in_subprocess(dtype) for dtype in args.dtypes.split(",")},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
