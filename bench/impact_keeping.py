"""Impact-aware keeping against TinyLFU on a reuse stream: hit rate and the compute hits still need.

Pass 1 (the model, torch engine): the workload's requests are fused with `cachecraft` in order, as one worker
would fuse them; the chunk impacts it measures are folded into the store's running means
(workers/chunks/impact.py). After each request, each of its chunks' stored impact is read: the value a store
would know at that chunk's next read. The stream (chunk, tokens, impact known before this read) goes to
--stream, so pass 2 can run again without the model (--stream-only).

Pass 2 (bookkeeping only): the stream replayed through `tinylfu` and `impact_tinylfu` (kvplane/eviction/policy.py) at
capacities that hold a share of the distinct chunks' KV. A read the policy holds is a hit; a miss computes the
chunk in full and writes it (admit). Per policy and capacity: token hit rate, and computed tokens = missed
tokens + for each hit, the tokens Cache-Craft's rule (workers/fusion/cachecraft.chunk_share at --ratio, over
the request's known impacts) recomputes.
"""
import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from cluster.bench.workload import read_workload
from kvplane.eviction.policy import make_policy
from workers.engines.torch_engine import TorchEngine
from workers.fusion.base import FusionOptions
from workers.fusion.cachecraft import chunk_share
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype, torch_dtype

POLICIES = ("tinylfu", "impact_tinylfu")
CAPACITY_SHARES = (0.05, 0.1, 0.2, 0.4)


def measure_stream(workload: Path, num_requests: int, dtype: str, ratio: float) -> list[list[dict[str, Any]]]:
    """Per request, per chunk: key, tokens, KV bytes and the impact stored before this read (None: unknown)."""
    engine = TorchEngine.from_checkpoint(load_checkpoint(prepare_default_model(), torch_dtype(dtype)))
    fuser = engine.fuser
    bytes_per_token = fuser.runner.config.num_layers * 2 * fuser.runner.config.num_kv_heads
    bytes_per_token *= fuser.runner.config.head_dim * fuser.runner.dtype.itemsize
    known: dict[str, float] = {}
    stream = []
    for request in read_workload(workload, num_requests):
        prompt = fuser.layout(request.documents, request.question)
        fuser.precompute(prompt)
        keys = [hashlib.sha1(str(ids).encode()).hexdigest() for ids in prompt.chunk_ids]  # the chunk's tokens
        stream.append([
            {"key": key, "tokens": len(ids), "bytes": len(ids) * bytes_per_token, "impact": known.get(key)}
            for key, ids in zip(keys, prompt.chunk_ids)
        ])
        fuser.fuse(prompt, "cachecraft", ratio)
        for key, impact in zip(keys, fuser.stored_impacts(prompt)):
            if impact is not None:
                known[key] = impact
    return stream


def replay(stream: list[list[dict[str, Any]]], policy_name: str, capacity_bytes: int, ratio: float) -> dict[str, Any]:
    """Hit rate and computed tokens of one policy at one capacity."""
    options = FusionOptions()
    policy = make_policy(policy_name, capacity_bytes)
    total = hit = computed = 0.0
    for reads in stream:
        impacts = [read["impact"] for read in reads if read["impact"] is not None]
        mean_impact = (sum(impacts) / len(impacts)) if impacts else 1.0
        for read in reads:
            if read["impact"] is not None:
                policy.note_impact(read["key"], read["impact"])
            total += read["tokens"]
            if policy.contains(read["key"]):
                hit += read["tokens"]
                impact = read["impact"] if read["impact"] is not None else mean_impact
                craft = options.craft
                share = chunk_share(impact, ratio, mean_impact or 1.0, craft.cci_reuse_below, craft.cci_full_above)
                computed += read["tokens"] * share
                policy.touch(read["key"])
            else:
                computed += read["tokens"]
                policy.touch(read["key"])
                policy.admit(read["key"], read["bytes"], 1.0)
    return {"policy": policy_name, "capacity_bytes": capacity_bytes, "token_hit_rate": round(hit / total, 4),
            "computed_share": round(computed / total, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO)
    parser.add_argument("--stream", type=Path, required=True, help="the measured read stream (JSON), written or read")
    parser.add_argument("--stream-only", action="store_true", help="replay --stream without the model")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dtype = resolve_dtype(args.dtype, prepare_default_model(), on_gpu=False)
    if not args.stream_only:
        args.stream.write_text(json.dumps(measure_stream(args.workload, args.num_requests, dtype, args.ratio)) + "\n")
    stream = json.loads(args.stream.read_text())
    distinct = {read["key"]: read["bytes"] for reads in stream for read in reads}
    rows = [
        {"capacity_share": share, **replay(stream, name, round(share * sum(distinct.values())), args.ratio)}
        for share in CAPACITY_SHARES
        for name in POLICIES
    ]
    result = {**measured_on(dtype), "workload": str(args.workload), "requests": len(stream),
              "distinct_chunks": len(distinct), "ratio": args.ratio, "rows": rows}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| capacity (share of distinct chunks' KV) | policy | token hit rate | tokens computed (share of all read) |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['capacity_share']:g} | {row['policy']} | {row['token_hit_rate']:.3f} "
              f"| {row['computed_share']:.3f} |")


if __name__ == "__main__":
    main()
