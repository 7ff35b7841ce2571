"""When a Cache-Craft chunk variant pays off: one reuse stream fused by cachecraft with and without them.

Two engines over one model (torch, or one vLLM engine fusing with two Fusers), each with its own chunk store: `base`
reads every chunk's base KV (computed after the prompt prefix); `variants` also keeps variants
(workers/chunks/variants.py: a chunk's KV computed after the chunks that preceded it in an earlier request, made at
write-back where its impact is high enough and, by default, only once those preceding chunks recur; at most two per
chunk) and serves the best-fitting one. The workload's requests go through both in order, as one worker would serve
them. Per request: chunk KV stored first (a first sight is computed in full, not scored), then full prefill's greedy
answer (the reference) and, per run (cachecraft on each engine, cacheblend on `base` as the yardstick, and
query_driven on `base` at each of --query-driven-ratios), the mode at --ratio: the variant fit of each chunk read
and the share of the context's per-layer KV recomputed (one fusion), the teacher-forced KL along the reference
answer (a second), the greedy answer, its time to first token and its write-back (a third, which is when variants
are made). With --pooled, cachecraft also runs with its shares pooled where the question reads
(FusionOptions.craft.placement = "pooled") on the base store and on a third engine keeping variants of its own.
"""
import argparse
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from cluster.bench.workload import WorkloadRequest, read_workload
from workers.chunks.store import LocalChunkStore
from workers.chunks.variants import VariantIndex, VariantRules
from workers.engines.base import BlendRequest
from workers.engines.torch_engine import TorchEngine
from workers.evaluation.engines import ENGINE_KINDS, load_eval_engine
from workers.evaluation.evaluate import EngineAccess, direct_access, engine_thread_access
from workers.evaluation.scoring import token_f1
from workers.fuser import Fuser
from workers.fusion.base import FusionOptions
from workers.fusion.cachecraft import CacheCraft
from workers.fusion.registry import make_fusion_modes
from workers.generation.divergence import teacher_forced_divergence
from workers.generation.sampling import SamplingParams
from workers.generation.teacher_forced import answer_logprobs
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype

MODE = "cachecraft"
POOLED_MODE = "cachecraft_pooled"  # cachecraft with craft.placement = "pooled"


@dataclass(frozen=True, slots=True)
class Run:
    """One mode on one engine at one ratio (None: --ratio)."""

    name: str
    engine: str
    mode: str
    ratio: float | None = None


# cachecraft without and with variants, and cacheblend (the yardstick: the serving default) on the base store
BASE_RUNS = (Run("base", "base", MODE), Run("variants", "variants", MODE), Run("cacheblend", "base", "cacheblend"))


POOLED_RUNS = (Run("pooled", "base", POOLED_MODE), Run("variants_pooled", "variants_pooled", POOLED_MODE))


def make_runs(query_driven_ratios: list[float], pooled: bool) -> tuple[Run, ...]:
    """The base runs (and pooled ones), then query_driven (the lowest-divergence mode) at each ratio given."""
    query_driven = tuple(Run(f"query_driven@{r:g}", "base", "query_driven", r) for r in query_driven_ratios)
    return BASE_RUNS + (POOLED_RUNS if pooled else ()) + query_driven


def fit_bucket(scores: list[float]) -> str:
    """A request's variant fit: `none` (no variant served), `exact` (every chunk after the first fit 1.0), `partial`."""
    served = [s for s in scores[1:] if s > 0.0]  # the first chunk's base KV is exact: it never gets a variant
    if not served:
        return "none"
    return "exact" if len(served) == len(scores) - 1 and min(served) == 1.0 else "partial"


def run_request(
    engines: dict[str, EngineAccess], runs: tuple[Run, ...], request: WorkloadRequest, ratio: float,
    max_new_tokens: int,
) -> dict[str, Any]:
    """One request through every run; the row of its figures."""
    documents = list(request.documents)
    sampling = SamplingParams(max_new_tokens=max_new_tokens)
    for access in engines.values():
        access.engine.store_documents(documents)
    base = engines["base"]
    prompt = base.engine.fuser.layout(documents, request.question)
    kv_end = base.kv_end(prompt)
    reference = base.engine.generate(BlendRequest(documents, request.question, "full_prefill", 1.0, sampling))
    targets = torch.tensor(reference.token_ids)
    reference_logprobs = base.call(
        lambda: answer_logprobs(base.engine.fuser, prompt, "full_prefill", 1.0, reference.token_ids, kv_end)
    )
    row: dict[str, Any] = {"id": request.id, "context_tokens": len(prompt.token_ids), "chunks": len(documents),
                           "full_prefill_ttft_s": reference.stats.ttft_s}
    for run in runs:
        access, fuser = engines[run.engine], engines[run.engine].engine.fuser
        run_ratio = ratio if run.ratio is None else run.ratio
        fused = access.call(lambda: fuser.fuse(prompt, run.mode, run_ratio, kv_end=kv_end))
        scores = [seg.cached.variant_score if seg.cached is not None else 0.0 for seg in fused.layout.chunk_segments()]
        logprobs = access.call(
            lambda: answer_logprobs(fuser, prompt, run.mode, run_ratio, reference.token_ids, kv_end)
        )
        divergence = teacher_forced_divergence(reference_logprobs, logprobs, targets)
        answer = access.engine.generate(BlendRequest(documents, request.question, run.mode, run_ratio, sampling))
        row[run.name] = {"recomputed_fraction": fused.prefill.recomputed_fraction, "tf_kl": divergence.kl,
                         "tf_nll_gap": divergence.nll_gap, "agreement_f1": token_f1(answer.text, reference.text),
                         "ttft_s": answer.stats.ttft_s, "variant_scores": [round(s, 3) for s in scores]}
    row["fit"] = fit_bucket(row["variants"]["variant_scores"])
    return row


def summarise(rows: list[dict[str, Any]], runs: tuple[Run, ...]) -> dict[str, Any]:
    """Per fit bucket (and all): requests, each run's mean recomputed share, KL and agreement, and TTFT median."""
    buckets: dict[str, Any] = {}
    for bucket in ("all", "none", "partial", "exact"):
        chosen = [row for row in rows if bucket in ("all", row["fit"])]
        if not chosen:
            continue
        entry: dict[str, Any] = {"requests": len(chosen)}
        for run in runs:
            entry[run.name] = {
                metric: round(statistics.fmean(row[run.name][metric] for row in chosen), 4)
                for metric in ("recomputed_fraction", "tf_kl", "agreement_f1")
            }
            entry[run.name]["ttft_s_median"] = round(statistics.median(row[run.name]["ttft_s"] for row in chosen), 4)
        buckets[bucket] = entry
    return buckets


def stored_bytes(store: LocalChunkStore) -> int:
    """KV bytes a chunk store holds (base chunks, the prefix and any variants)."""
    return sum(chunk.kv.numel() * chunk.kv.element_size() for chunk in store.entries.values())


def load_engines(kind: str, dtype: str, rules: VariantRules, pooled: bool) -> tuple[dict[str, EngineAccess], str]:
    """`base` and `variants` (and `variants_pooled`) over one model (SmolLM2), each with its own store; the dtype."""
    dtype = resolve_dtype(dtype, prepare_default_model(), on_gpu=False)
    options = FusionOptions()
    pooled = replace(options, craft=replace(options.craft, placement="pooled"))
    modes = {**make_fusion_modes(options), POOLED_MODE: CacheCraft(pooled)}
    base = load_eval_engine(kind, dtype=dtype, options=options, modes=modes)
    runner = base.engine.fuser.runner
    fusers = {"variants": Fuser(runner, options, modes=modes, variants=VariantIndex(rules))}
    if pooled:
        fusers["variants_pooled"] = Fuser(runner, options, modes=modes, variants=VariantIndex(rules))
    if kind == "torch":
        return {"base": base, **{name: direct_access(TorchEngine(f)) for name, f in fusers.items()}}, dtype
    vllm = base.engine
    return {"base": base, **{name: engine_thread_access(vllm.with_fuser(f)) for name, f in fusers.items()}}, dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--num-requests", type=int, default=80)
    parser.add_argument("--engine", choices=ENGINE_KINDS, default="torch")
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--query-driven-ratios", default="",
                        help="comma-separated ratios query_driven runs at on the base store (none by default)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO)
    parser.add_argument("--create-after", type=int, default=VariantRules().create_after_sightings,
                        help="sightings of a chunk's preceding chunks before a variant is made (1: on first sight)")
    parser.add_argument("--pooled", action="store_true",
                        help="also run cachecraft with its shares pooled where the question reads")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = make_runs([float(r) for r in args.query_driven_ratios.split(",") if r], args.pooled)
    rules = VariantRules(create_after_sightings=args.create_after)
    engines, dtype = load_engines(args.engine, args.dtype, rules, args.pooled)
    rows: list[dict[str, Any]] = []
    try:
        for request in read_workload(args.workload, args.num_requests):
            rows.append(run_request(engines, runs, request, args.ratio, args.max_new_tokens))
            # the stores' state depends on every request before: a stopped run cannot resume, but shows progress
            print(json.dumps({"request": len(rows), **rows[-1]}), flush=True)
    finally:
        engines["base"].engine.close()  # the vLLM engine both fuse on; nothing for torch
    stores = {name: access.engine.fuser.store for name, access in engines.items()}
    result = {**measured_on(dtype), "engine": args.engine, "workload": str(args.workload), "requests": len(rows),
              "runs": [[run.name, run.engine, run.mode, run.ratio or args.ratio] for run in runs],
              "ratio": args.ratio, "options": str(FusionOptions()), "rules": str(rules),
              "entries_stored": {name: len(store) for name, store in stores.items()},
              "bytes_stored": {name: stored_bytes(store) for name, store in stores.items()},
              "summary": summarise(rows, runs), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
