"""Where a request's TTFT goes on a quiet vLLM engine in this process: blended against plain, stage by stage.

The same requests as a serving benchmark's workload, their documents stored first (in this process's memory:
no shard, no HTTP), each request answered blended and plainly in turn with vLLM's prefix cache emptied before
each; the median seconds of each stage (workers.engines.stages) per plan. With --profile, the blended requests
are run once more under cProfile on the engine thread and the functions taking the most time are listed.
Set beside `blendserve bench serve`'s `stages_s` (the same stages, served through HTTP), it shows what the
serving stack adds.
"""
import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile
from pathlib import Path
from typing import Any

from cluster.bench.workload import read_workload
from workers.engines.base import PLAIN_MODE, BlendRequest, PrefillStats
from workers.generation.sampling import SamplingParams
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype
from workers.vllm.engine import VLLMEngine
from workers.vllm.settings import VLLMSettings

NAMESPACE = "request-stages"
KV_CACHE_BYTES = 1 << 30


def _answer(engine: VLLMEngine, request: BlendRequest) -> PrefillStats:
    engine.forget_fused_contexts()  # every request prefilled afresh: no block of it left in vLLM's prefix cache
    generation = engine.open(request)
    for _ in generation:
        pass
    return generation.stats


def _medians(rows: list[PrefillStats]) -> dict[str, float]:
    stages = sorted({stage for row in rows for stage in row.stages_s})
    medians = {stage: round(statistics.median(row.stages_s.get(stage, 0.0) for row in rows), 4) for stage in stages}
    return {"ttft_s": round(statistics.median(row.ttft_s for row in rows), 4), **medians}


def _profile(engine: VLLMEngine, requests: list[BlendRequest], top: int) -> str:
    """The `top` functions by own time while the requests run, on the engine thread (where the fusion runs)."""
    profiler = cProfile.Profile()
    engine.call(profiler.enable)
    for request in requests:
        _answer(engine, request)
    engine.call(profiler.disable)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--num-requests", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4, help="requests answered first, untimed")
    parser.add_argument("--mode", default="cacheblend")
    parser.add_argument("--dtype", default=AUTO, choices=DTYPE_CHOICES)
    parser.add_argument("--profile", type=int, default=0, help="list this many functions by own time (0: none)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    path = prepare_default_model()
    dtype = resolve_dtype(args.dtype, path, on_gpu=False)
    workload = read_workload(args.workload, limit=args.warmup + args.num_requests)
    sampling = SamplingParams(max_new_tokens=1)
    requests = {
        mode: [BlendRequest(list(r.documents), r.question, mode, None, sampling, NAMESPACE) for r in workload]
        for mode in (args.mode, PLAIN_MODE)
    }
    settings = VLLMSettings(max_model_len=8192, kv_cache_bytes=KV_CACHE_BYTES)
    engine = VLLMEngine.start(path, Path(tempfile.mkdtemp(prefix="bs-stages-")), settings, dtype)
    try:
        for request in requests[args.mode]:
            engine.store_documents(request.documents, NAMESPACE)
        rows: dict[str, list[PrefillStats]] = {mode: [] for mode in requests}
        for index in range(len(workload)):
            for mode, each in requests.items():
                stats = _answer(engine, each[index])
                if index >= args.warmup:
                    rows[mode].append(stats)
        timed = requests[args.mode][args.warmup :]
        profile = _profile(engine, timed, args.profile) if args.profile else ""
    finally:
        engine.close()
    result: dict[str, Any] = {
        "command": "python bench/request_stages.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "machine": measured_on(dtype),
        "num_requests": len(rows[args.mode]),
        "prompt_tokens_p50": statistics.median(row.num_prompt_tokens for row in rows[args.mode]),
        "stages_s": {mode: _medians(found) for mode, found in rows.items()},
        "profile": profile.splitlines(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
