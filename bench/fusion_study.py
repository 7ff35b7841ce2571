"""Two design measurements for cacheblend: which deviation (K, V or both) finds the tokens that matter, and
whether chunk KV computed after the prompt prefix beats chunk KV computed alone. Writes one JSON file."""
import argparse
import json
import statistics
from pathlib import Path

import torch

from workers.chunks.store import LocalChunkStore
from workers.engines.torch_engine import TorchEngine
from workers.evaluation.dataset import load_records
from workers.fusion.base import FusionOptions
from workers.fusion.deviation import DEVIATION_METRICS, kv_deviation
from workers.generation.divergence import first_token_kl
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype, torch_dtype
from workers.model.kv_cache import KVCache

CHECK_LAYER = 1


def main() -> None:
    """Parse arguments, measure every (chunk context, metric) pair on the same records, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--out", type=Path, default=Path("docs/results/chunk_context/fusion_study.json"))
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO, help="compute dtype (auto: by the CPU)")
    args = parser.parse_args()
    model = prepare_default_model()
    checkpoint = load_checkpoint(model, torch_dtype(resolve_dtype(args.dtype, model, on_gpu=False)))
    stores = {context: LocalChunkStore() for context in ("alone", "prefix")}  # chunk KV does not depend on the metric
    engines = {
        (
            context,
            metric,
        ): TorchEngine.from_checkpoint(  # options as docs/quality.md was measured: single tokens, gradual filtering
            checkpoint,
            FusionOptions(deviation_metric=metric, selection_span_tokens=1).with_gradual_filtering(),
            store=store,
            chunk_context=context,
        )
        for context, store in stores.items()
        for metric in DEVIATION_METRICS
    }
    rows: dict[str, dict[str, list[float]]] = {}
    for record in load_records(args.data, args.limit):
        measure_record(engines, record.documents, record.question, args.ratio, rows)
    summary = {label: {k: statistics.fmean(v) for k, v in cols.items()} for label, cols in rows.items()}
    result = {
        **measured_on(checkpoint.weights.embed.dtype),
        "data": str(args.data),
        "records": args.limit,
        "ratio": args.ratio,
        "results": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def measure_record(engines: dict, documents: list[str], question: str, ratio: float, rows: dict) -> None:
    """Full prefill once; per chunk context full_reuse once; per metric the recall and cacheblend."""
    first = next(iter(engines.values()))
    prompt = first.fuser.layout(documents, question)
    full = first.fuser.fuse(prompt, "full_prefill", 1.0)
    full_cache = full.cache
    full_logprobs = first.fuser.runner.logits(full.prefill.last_hidden[None])[0].log_softmax(-1)
    num_context = len(prompt.token_ids) - len(prompt.suffix_ids)
    for context in ("alone", "prefix"):
        engine = engines[(context, DEVIATION_METRICS[0])]
        engine.fuser.precompute(prompt)
        reuse = engine.fuser.fuse(prompt, "full_reuse", 0.0)
        reuse_cache, layout = reuse.cache, reuse.layout
        add(
            rows.setdefault(f"{context}/full_reuse", {}),
            reuse_cache,
            reuse.prefill.last_hidden,
            full_cache,
            full_logprobs,
            engine,
            num_context,
        )
        for metric in DEVIATION_METRICS:
            engine = engines[(context, metric)]
            engine.fuser.precompute(prompt)
            row = rows.setdefault(f"{context}/cacheblend/{metric}", {})
            row.setdefault("hkvd_recall", []).append(hkvd_recall(full_cache, reuse_cache, layout, metric, ratio))
            blended = engine.fuser.fuse(prompt, "cacheblend", ratio)
            add(row, blended.cache, blended.prefill.last_hidden, full_cache, full_logprobs, engine, num_context)


def add(
    row: dict,
    cache: KVCache,
    last_hidden: torch.Tensor,
    full_cache: KVCache,
    full_logprobs: torch.Tensor,
    engine: TorchEngine,
    num_context: int,
) -> None:
    """Append first-token KL and mean squared KV error over the context, both against full prefill."""
    logprobs = engine.fuser.runner.logits(last_hidden[None])[0].log_softmax(-1)
    row.setdefault("first_token_kl", []).append(first_token_kl(full_logprobs, logprobs))
    error = (cache.data[:, :, :num_context].float() - full_cache.data[:, :, :num_context].float()).pow(2).mean()
    row.setdefault("kv_mse", []).append(float(error))


def hkvd_recall(full_cache: KVCache, reuse_cache: KVCache, layout, metric: str, ratio: float) -> float:
    """Share of the true top-ratio deviating tokens (over all layers) that the check-layer metric also ranks top."""
    reusable = (~layout.forced).nonzero().squeeze(1)
    truth = (full_cache.data[:, :, reusable].float() - reuse_cache.data[:, :, reusable].float()).pow(2)
    true_score = truth.sum(dim=(0, 1, 3, 4))  # [R]
    fresh, cached = full_cache.data[CHECK_LAYER, :, reusable], reuse_cache.data[CHECK_LAYER, :, reusable]
    score = kv_deviation(fresh[0], fresh[1], cached[0], cached[1], metric)
    count = max(1, int(ratio * len(reusable)))
    top_true = set(torch.topk(true_score, count).indices.tolist())
    top_metric = set(torch.topk(score, count).indices.tolist())
    return len(top_true & top_metric) / count


if __name__ == "__main__":
    main()
