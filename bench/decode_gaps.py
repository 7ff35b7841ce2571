"""Decode speed in this process: blendserve's vLLM engine against vLLM's own LLMEngine, with and without the connector.

The same prompts (a serving workload's, laid out by blendserve's template) prefilled plainly and decoded for
--max-tokens greedy tokens, --concurrency requests at a time; the median gap between a request's tokens (its
first few left out). Set beside `blendserve bench serve`'s ITL it splits what the engine costs per token from
what the serving path (worker replica, ingress, proxy) adds. Each engine runs in a process of its own.

    .venv/bin/python bench/decode_gaps.py --workload docs/results/workloads/2wiki_k8.jsonl \
        --out docs/results/stages/decode_gaps.json
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cluster.bench.workload import read_workload
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype
from workers.vllm.settings import VLLMSettings

SKIPPED_GAPS = 4  # a request's first gaps overlap the other requests' prefills
ENGINES = ("blendserve", "vllm", "vllm_connector")
NUM_PROMPTS = 8
SETTINGS = VLLMSettings(kv_cache_bytes=1 << 30)  # both engines' (the rest: blendserve's defaults)


def _gaps(times_s: list[float]) -> list[float]:
    return [b - a for a, b in zip(times_s, times_s[1:])][SKIPPED_GAPS:]


def blendserve_gaps(path: Path, dtype: str, records: list[Any], loads: list[int], rounds: int,
                    max_tokens: int) -> dict[int, list[float]]:
    """Gaps per concurrency through VLLMEngine.open, each request on its own thread as in the worker."""
    from workers.engines.base import PLAIN_MODE, BlendRequest
    from workers.generation.sampling import SamplingParams
    from workers.vllm.engine import VLLMEngine

    engine = VLLMEngine.start(path, Path(tempfile.mkdtemp(prefix="bs-gaps-")), SETTINGS, dtype)
    sampling = SamplingParams(max_new_tokens=max_tokens)
    gaps: dict[int, list[float]] = {load: [] for load in loads}
    lock = threading.Lock()

    def answer(record: Any, load: int) -> None:
        request = BlendRequest(list(record.documents), record.question, PLAIN_MODE, None, sampling, "gaps")
        times_s = [time.perf_counter() for _ in engine.open(request)]
        with lock:
            gaps[load].extend(_gaps(times_s))

    try:
        for load in loads:
            for round_index in range(rounds):
                threads = [threading.Thread(target=answer, args=(records[(round_index + i) % len(records)], load))
                           for i in range(load)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
    finally:
        engine.close()
    return gaps


def vllm_gaps(path: Path, dtype: str, records: list[Any], loads: list[int], rounds: int, max_tokens: int,
              connector: bool) -> dict[int, list[float]]:
    """Gaps per concurrency through vLLM's LLMEngine stepped on this thread, built as blendserve builds it."""
    from workers.vllm.engine_config import cpu_threads, set_cpu_env

    set_cpu_env(Path(tempfile.mkdtemp(prefix="bs-gaps-")), in_process=True)  # before vLLM is imported
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from workers.generation.prompt import PromptTemplate
    from workers.vllm.engine import build_llm_engine

    engine = build_llm_engine(path, SETTINGS, dtype, cpu_threads(), with_connector=connector)
    template = PromptTemplate(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    prompts = [template.layout(list(r.documents), r.question).token_ids for r in records]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, detokenize=False)
    gaps: dict[int, list[float]] = {load: [] for load in loads}
    for load in loads:
        for round_index in range(rounds):
            times_s: dict[str, list[float]] = {}
            for i in range(load):
                request_id = f"{load}-{round_index}-{i}"
                prompt = {"prompt_token_ids": prompts[(round_index + i) % len(prompts)]}
                engine.add_request(request_id, prompt, params)
                times_s[request_id] = []
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.outputs[0].token_ids:
                        times_s[output.request_id].append(time.perf_counter())
            for each in times_s.values():
                gaps[load].extend(_gaps(each))
    return gaps


def _one_engine(args: argparse.Namespace) -> dict[str, float]:
    path = prepare_default_model()
    dtype = resolve_dtype(args.dtype, path, on_gpu=False)
    records = read_workload(args.workload, limit=NUM_PROMPTS)
    loads = [int(c) for c in args.concurrency.split(",")]
    if args.engine == "blendserve":
        gaps = blendserve_gaps(path, dtype, records, loads, args.rounds, args.max_tokens)
    else:
        gaps = vllm_gaps(path, dtype, records, loads, args.rounds, args.max_tokens,
                         connector=args.engine == "vllm_connector")
    return {f"concurrency_{load}": round(statistics.median(each), 4) for load, each in gaps.items()}


def _argv(args: argparse.Namespace) -> list[str]:
    return ["--workload", str(args.workload), "--concurrency", args.concurrency, "--rounds", str(args.rounds),
            "--max-tokens", str(args.max_tokens), "--dtype", args.dtype]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--engine", choices=ENGINES, help="run this engine only (the driver's child processes)")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", default=AUTO, choices=DTYPE_CHOICES)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.engine is not None:
        args.out.write_text(json.dumps(_one_engine(args)) + "\n")
        return
    medians = {}
    for engine in ENGINES:  # one process each: vLLM's engine state is per process
        part = args.out.with_suffix(f".{engine}.part")
        subprocess.run([sys.executable, __file__, *_argv(args), "--engine", engine, "--out", str(part)], check=True)
        medians[engine] = json.loads(part.read_text())
        part.unlink()
    result = {
        "command": "python bench/decode_gaps.py " + " ".join(_argv(args)),
        "machine": measured_on(resolve_dtype(args.dtype, prepare_default_model(), on_gpu=False)),
        "max_tokens": args.max_tokens,
        "median_gap_s": medians,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
