"""TTFT p50/p99 and agreement F1 per tier (RAM, SSD, S3, S3 with jitter) under three loading policies, in one run."""
import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from kvplane.store import TieredStore  # noqa: E402
from kvplane.tiers.jitter import JitterConfig, JitterTier, delay_quantile_s  # noqa: E402
from kvplane.tiers.local_s3 import LocalS3, create_bucket, s3_storage_options  # noqa: E402
from kvplane.tiers.spec import TierSpec, open_tier  # noqa: E402
from kvplane.tiers.tier import Tier  # noqa: E402
from workers.chunks.kvplane_store import KVPlaneChunkStore  # noqa: E402
from workers.engines.base import BlendRequest  # noqa: E402
from workers.engines.torch_engine import TorchEngine  # noqa: E402
from workers.evaluation.dataset import QARecord, load_records  # noqa: E402
from workers.evaluation.scoring import token_f1  # noqa: E402
from workers.fusion.base import FusionOptions  # noqa: E402
from workers.fusion.layer_feed import EagerLoader, PipelinedLoader  # noqa: E402
from workers.generation.sampling import SamplingParams  # noqa: E402
from workers.loading.controller import LoadingController  # noqa: E402
from workers.loading.delay_model import RecomputeDelayModel, calibrate_runner  # noqa: E402
from workers.loading.plan import ControllerOptions  # noqa: E402
from workers.model.checkpoint import Checkpoint, load_checkpoint  # noqa: E402
from workers.model.default import prepare_default_model  # noqa: E402
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype, torch_dtype  # noqa: E402
from workers.model.runner import ModelRunner  # noqa: E402

TIERS = ("ram", "ssd", "s3", "s3_jitter")
# Not in the default run: a jittery remote shard (RAM behind a congested network) above a steady S3, both
# holding every chunk; the fixed policy reads the upper tier, the controller may switch.
TWO_TIER = "remote_jitter_over_s3"
POLICIES = ("no_pipeline", "pipeline_fixed", "controller")
S3_BUCKET = "kvcache"


def main() -> None:
    """Parse arguments, run every tier under every policy, write the JSON and the plot."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/musique_cacheblend.dev.jsonl"))
    parser.add_argument("--records", type=int, default=3)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=10, help="documents kept per record")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the records per tier and policy")
    parser.add_argument("--tiers", default=",".join(TIERS))
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--jitter-median-ms", type=float, default=20.0)
    parser.add_argument("--jitter-sigma", type=float, default=0.6)
    parser.add_argument("--jitter-spike-probability", type=float, default=0.01)
    parser.add_argument("--jitter-spike-ms", type=float, default=250.0)
    parser.add_argument("--out", type=Path, default=Path("docs/results/controller/controller.json"))
    parser.add_argument("--plot", type=Path, default=Path("docs/controller_ttft.png"))
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO, help="compute dtype (auto: by the CPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    jitter = JitterConfig(args.jitter_median_ms / 1e3, args.jitter_sigma, args.jitter_spike_probability,
                          args.jitter_spike_ms / 1e3, seed=0)
    model = prepare_default_model()
    checkpoint = load_checkpoint(model, torch_dtype(resolve_dtype(args.dtype, model, on_gpu=False)))
    records = [QARecord(r.id, r.question, r.answers, r.documents[: args.chunks])
               for r in load_records(args.data, args.records, args.offset)]
    began = time.perf_counter()
    delays = calibrate_runner(ModelRunner(checkpoint))
    calibration_s = time.perf_counter() - began
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
    references = _references(checkpoint, records, sampling)
    results = {}
    for tier in args.tiers.split(","):
        with _store(tier, jitter) as store:
            results[tier] = _run_tier(checkpoint, store, records, references, delays, args.ratio, args.repeats,
                                      sampling)
    result = {
        **measured_on(checkpoint.weights.embed.dtype),
        "data": str(args.data),
        "records": len(records),
        "offset": args.offset,
        "chunks_per_record": args.chunks,
        "repeats": args.repeats,
        "ratio": args.ratio,
        "torch_threads": args.threads,
        "max_new_tokens": args.max_new_tokens,
        "jitter": {**asdict(jitter), "p50_s": delay_quantile_s(jitter, 0.5), "p95_s": delay_quantile_s(jitter, 0.95),
                   "p99_s": delay_quantile_s(jitter, 0.99)},
        "delay_model": asdict(delays),
        "calibration_s": calibration_s,
        "full_prefill_ttft_s_median": statistics.median(ref["ttft_s"] for ref in references),
        "context_tokens_mean": statistics.fmean(ref["context_tokens"] for ref in references),
        "load_average_1_5_15_min": {"start": load_before, "end": os.getloadavg()},
        "tiers": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.plot)


def _references(checkpoint: Checkpoint, records: list[QARecord], sampling: SamplingParams) -> list[dict]:
    """Full-prefill answers (for agreement F1) and TTFTs of every record."""
    engine = TorchEngine.from_checkpoint(checkpoint)
    references = []
    for record in records:
        answer = engine.generate(BlendRequest(record.documents, record.question, "full_prefill", sampling=sampling))
        references.append({"text": answer.text, "ttft_s": answer.stats.ttft_s,
                           "context_tokens": answer.stats.context_tokens})
    return references


@contextmanager
def _store(tier: str, jitter: JitterConfig) -> Iterator[TieredStore]:
    """A one-tier store of the named kind (or TWO_TIER), on a scratch directory or a moto S3 server."""
    with ExitStack() as stack:
        if tier == TWO_TIER:
            endpoint = stack.enter_context(LocalS3())
            create_bucket(endpoint, S3_BUCKET)
            s3 = open_tier(TierSpec("s3", f"s3://{S3_BUCKET}/{uuid.uuid4().hex}", 8 << 30, "lru",
                                    s3_storage_options(endpoint)))
            remote = JitterTier(open_tier(TierSpec("remote", "ram://", 8 << 30, "lru")), jitter)
            yield stack.enter_context(TieredStore([remote, s3], ["lru", "lru"]))
            return
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="controller-bench-")))
        if tier == "ram":
            spec = TierSpec("ram", "ram://", 8 << 30, "lru")
        elif tier == "ssd":
            spec = TierSpec("ssd", f"file://{scratch / 'ssd'}", 8 << 30, "lru")
        elif tier in ("s3", "s3_jitter"):
            endpoint = stack.enter_context(LocalS3())
            create_bucket(endpoint, S3_BUCKET)
            spec = TierSpec(tier, f"s3://{S3_BUCKET}/{uuid.uuid4().hex}", 8 << 30, "lru", s3_storage_options(endpoint))
        else:
            raise ValueError(f"unknown tier {tier!r}; choose from {(*TIERS, TWO_TIER)}")
        opened: Tier = open_tier(spec)
        if tier == "s3_jitter":
            opened = JitterTier(opened, jitter)
        yield stack.enter_context(TieredStore([opened], [spec.policy]))


def _run_tier(
    checkpoint: Checkpoint,
    store: TieredStore,
    records: list[QARecord],
    references: list[dict],
    delays: RecomputeDelayModel,
    ratio: float,
    repeats: int,
    sampling: SamplingParams,
) -> dict:
    """Store every record's chunks, time a load-only pass, then run each policy on every record `repeats` times."""
    chunk_store = KVPlaneChunkStore(store, checkpoint.fingerprint)
    writer = TorchEngine.from_checkpoint(checkpoint, store=chunk_store)
    keys = []
    for record in records:
        stored = writer.store_documents(record.documents)  # the chunks and the prompt prefix
        prefix_ids = writer.fuser.layout(record.documents, record.question).prefix_ids
        keys.append([chunk_store.key(prefix_ids, [])] + [chunk.key for chunk in stored])
    store.flush()
    load_s = [_load_s(store, record_keys) for record_keys in keys]
    # as docs/controller.md was measured: single tokens, gradual filtering
    options = FusionOptions(recompute_ratio=ratio, selection_span_tokens=1).with_gradual_filtering()
    policies = {}
    for policy in POLICIES:
        controller = (LoadingController(delays, options=ControllerOptions.from_fusion(options))
                      if policy == "controller" else None)
        loader = EagerLoader() if policy == "no_pipeline" else PipelinedLoader()
        engine = TorchEngine.from_checkpoint(
            checkpoint, options, store=chunk_store, loader=loader, controller=controller
        )
        warm = records[0]
        engine.generate(BlendRequest(warm.documents, warm.question, "cacheblend", sampling=sampling))  # not timed
        runs = []
        for _ in range(repeats):
            for record, reference in zip(records, references):
                answer = engine.generate(BlendRequest(record.documents, record.question, "cacheblend",
                                                      sampling=sampling))
                plan = controller.last_plan if controller is not None else None
                runs.append({
                    "reused_tokens_by_tier": answer.stats.reused_tokens_by_tier,
                    "ttft_s": answer.stats.ttft_s,
                    "agreement_f1": token_f1(answer.text, reference["text"]),
                    "ratio": answer.stats.recompute_ratio,
                    "chunks_recomputed": 0 if plan is None else len(plan.recomputed),
                    "predicted_ttft_p95_s": None if plan is None else plan.ttft_p95_s,
                })
        policies[policy] = _summary(runs)
        if controller is not None:
            policies[policy]["observed_fetch_s"] = {
                name: asdict(quantiles) for name, quantiles in controller.telemetry.snapshot().items()
            }
    return {"load_only_s_median": statistics.median(load_s), "policies": policies}


def _load_s(store: TieredStore, keys: list[str]) -> float:
    """Seconds to read every layer of a record's cached parts one after another, without any compute."""
    began = time.perf_counter()
    for key in keys:
        stream = store.read_layers(key)
        if stream is None:
            raise RuntimeError(f"benchmark chunk {key} went missing")
        for _layer in stream:
            pass
    return time.perf_counter() - began


def _summary(runs: list[dict]) -> dict:
    ttft = [run["ttft_s"] for run in runs]
    return {
        "n": len(runs),
        "ttft_s_p50": float(np.percentile(ttft, 50)),
        "ttft_s_p99": float(np.percentile(ttft, 99)),
        "ttft_s_mean": statistics.fmean(ttft),
        "agreement_f1": statistics.fmean(run["agreement_f1"] for run in runs),
        "ratio_mean": statistics.fmean(run["ratio"] for run in runs),
        "chunks_recomputed_mean": statistics.fmean(run["chunks_recomputed"] for run in runs),
        "runs": runs,
    }


def plot(result: dict, path: Path) -> None:
    """TTFT p50 (bars) and p99 (hatched bars behind them) per tier, one colour per policy."""
    tiers = list(result["tiers"])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(POLICIES)
    for index, policy in enumerate(POLICIES):
        x = np.arange(len(tiers)) + (index - (len(POLICIES) - 1) / 2) * width
        p50 = [result["tiers"][tier]["policies"][policy]["ttft_s_p50"] for tier in tiers]
        p99 = [result["tiers"][tier]["policies"][policy]["ttft_s_p99"] for tier in tiers]
        bars = ax.bar(x, p99, width, alpha=0.35, hatch="//", label=f"{policy} p99")
        ax.bar(x, p50, width, color=bars.patches[0].get_facecolor()[:3], label=f"{policy} p50")
    ax.axhline(result["full_prefill_ttft_s_median"], color="gray", linestyle="--", label="full prefill p50")
    ax.set_xticks(np.arange(len(tiers)), tiers)
    ax.set(ylabel="TTFT (s)", title=f"{Path(result['data']).name}: {result['records']} records x {result['repeats']}, "
           f"~{result['context_tokens_mean']:.0f} tokens, r={result['ratio']}, SmolLM2-135M bf16, CPU")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
