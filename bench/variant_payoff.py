"""When a Cache-Craft chunk variant pays off (issue 19): one reuse stream fused by cachecraft with and without them.

Two torch engines over one model, each with its own chunk store: `base` reads every chunk's base KV (computed
after the prompt prefix); `variants` also keeps variants (workers/chunk_variants.py: a chunk's KV computed after
the chunks that preceded it in an earlier request, made at write-back where its impact is high enough and, by
default, only once those preceding chunks recur; at most two per chunk) and serves the best-fitting one. The
workload's requests go through both in order, as one worker would serve them. Per request: chunk KV stored first
(a first sight is computed in full, not scored), then full prefill's greedy answer (the reference) and, per run
(cachecraft on each engine, cacheblend on `base` as the yardstick), the mode at --ratio: the variant fit of each
chunk read and the share of the context's per-layer KV recomputed (one fusion), the teacher-forced KL along the
reference answer (a second), the greedy answer and its write-back (a third, which is when variants are made).
"""
import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from cluster.bench_workload import WorkloadRequest, read_workload
from workers.checkpoint import load_checkpoint
from workers.chunk_store import LocalChunkStore
from workers.chunk_variants import VariantIndex, VariantRules
from workers.default_model import prepare_default_model
from workers.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype, torch_dtype
from workers.engine_base import BlendRequest
from workers.evaluation.divergence import teacher_forced_divergence
from workers.evaluation.scoring import token_f1
from workers.evaluation.teacher_forced import answer_logprobs
from workers.fuser import Fuser
from workers.fusion.base import FusionOptions
from workers.runner import ModelRunner
from workers.sampling import SamplingParams
from workers.torch_engine import TorchEngine

MODE = "cachecraft"
# (run, engine, mode): cachecraft without and with variants, and cacheblend (the yardstick) on the base store
RUNS = (("base", "base", MODE), ("variants", "variants", MODE), ("cacheblend", "base", "cacheblend"))


def fit_bucket(scores: list[float]) -> str:
    """A request's variant fit: `none` (no variant served), `exact` (every chunk after the first fit 1.0), `partial`."""
    served = [s for s in scores[1:] if s > 0.0]  # the first chunk's base KV is exact: it never gets a variant
    if not served:
        return "none"
    return "exact" if len(served) == len(scores) - 1 and min(served) == 1.0 else "partial"


def run_request(
    engines: dict[str, TorchEngine], request: WorkloadRequest, ratio: float, max_new_tokens: int
) -> dict[str, Any]:
    """One request through every run; the row of its figures."""
    documents = list(request.documents)
    sampling = SamplingParams(max_new_tokens=max_new_tokens)
    for engine in engines.values():
        engine.store_documents(documents)
    base = engines["base"]
    prompt = base.fuser.layout(documents, request.question)
    kv_end = len(prompt.token_ids)
    reference = base.generate(BlendRequest(documents, request.question, "full_prefill", 1.0, sampling))
    targets = torch.tensor(reference.token_ids)
    reference_logprobs = answer_logprobs(base.fuser, prompt, "full_prefill", 1.0, reference.token_ids, kv_end)
    row: dict[str, Any] = {"id": request.id, "context_tokens": len(prompt.token_ids), "chunks": len(documents)}
    for name, engine_name, mode in RUNS:
        engine = engines[engine_name]
        fused = engine.fuser.fuse(prompt, mode, ratio)
        scores = [seg.cached.variant_score if seg.cached is not None else 0.0 for seg in fused.layout.chunk_segments()]
        logprobs = answer_logprobs(engine.fuser, prompt, mode, ratio, reference.token_ids, kv_end)
        divergence = teacher_forced_divergence(reference_logprobs, logprobs, targets)
        answer = engine.generate(BlendRequest(documents, request.question, mode, ratio, sampling))
        row[name] = {"recomputed_fraction": fused.prefill.recomputed_fraction, "tf_kl": divergence.kl,
                     "tf_nll_gap": divergence.nll_gap, "agreement_f1": token_f1(answer.text, reference.text),
                     "variant_scores": [round(s, 3) for s in scores]}
    row["fit"] = fit_bucket(row["variants"]["variant_scores"])
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per fit bucket (and all): requests, and each run's mean recomputed share, teacher-forced KL, agreement."""
    buckets: dict[str, Any] = {}
    for bucket in ("all", "none", "partial", "exact"):
        chosen = [row for row in rows if bucket in ("all", row["fit"])]
        if not chosen:
            continue
        entry: dict[str, Any] = {"requests": len(chosen)}
        for name, _, _ in RUNS:
            entry[name] = {
                metric: round(statistics.fmean(row[name][metric] for row in chosen), 4)
                for metric in ("recomputed_fraction", "tf_kl", "agreement_f1")
            }
        buckets[bucket] = entry
    return buckets


def stored_bytes(store: LocalChunkStore) -> int:
    """KV bytes a chunk store holds (base chunks, the prefix and any variants)."""
    return sum(chunk.kv.numel() * chunk.kv.element_size() for chunk in store.entries.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--num-requests", type=int, default=80)
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO)
    parser.add_argument("--create-after", type=int, default=VariantRules().create_after_sightings,
                        help="sightings of a chunk's preceding chunks before a variant is made (1: on first sight)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model_path = prepare_default_model()
    dtype = resolve_dtype(args.dtype, model_path, on_gpu=False)
    runner = ModelRunner(load_checkpoint(model_path, torch_dtype(dtype)))
    index = VariantIndex(VariantRules(create_after_sightings=args.create_after))
    engines = {"base": TorchEngine(Fuser(runner)), "variants": TorchEngine(Fuser(runner, variants=index))}
    rows = [run_request(engines, request, args.ratio, args.max_new_tokens)
            for request in read_workload(args.workload, args.num_requests)]
    stores = {name: engine.fuser.store for name, engine in engines.items()}
    result = {**measured_on(dtype), "workload": str(args.workload), "requests": len(rows), "runs": RUNS,
              "ratio": args.ratio, "options": str(FusionOptions()), "rules": str(index.rules),
              "entries_stored": {name: len(store) for name, store in stores.items()},
              "bytes_stored": {name: stored_bytes(store) for name, store in stores.items()},
              "summary": summarise(rows), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
