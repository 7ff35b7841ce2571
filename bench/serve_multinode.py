"""The Serve app on a loopback Ray cluster of N nodes (one worker replica and one KV shard each), one workload
routed by cache affinity, power-of-two choices and round robin: hit rate per tier, bytes between nodes, TTFT.

python bench/serve_multinode.py --workload w.jsonl --nodes 3,2 --num-requests 48 --rate 0.4 \
    --out docs/results/multinode/serve_multinode.json
Each (nodes, policy) run starts a fresh cluster (empty caches) and is written to --out as soon as it ends.
"""
import argparse
import asyncio
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from cluster.bench.client import DEFAULT_TIMEOUT, Outcome, blendserve_completion
from cluster.bench.metrics import percentiles, reuse_timeline
from cluster.bench.serve import LoadPoint, drive
from cluster.bench.systems import free_port
from cluster.bench.workload import WorkloadRequest, read_workload
from scheduler.simulation.routers import ROUTING_POLICIES
from scheduler.weights import RouterWeights
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model
from workers.model.dtype import dtype_width_bytes, measured_on, resolve_dtype

MODEL = "SmolLM2-135M-Instruct"
READY_TIMEOUT_S = 600
_log = logging.getLogger("serve_multinode")


def app_config(args: argparse.Namespace, num_nodes: int, root: Path, dtype: str) -> dict[str, Any]:
    """One worker replica per node, small device and ram tiers (so routing decides hits), a file object tier."""
    engine: dict[str, Any] = {"kind": args.engine}
    if args.engine == "torch":
        engine["num_threads"] = 1
    else:
        engine["vllm"] = {"kv_cache_bytes": 256 << 20, "max_model_len": 4096, "num_threads": 1}
    return {
        "model": {"dtype": dtype},
        "engine": engine,
        "workers": {"num_replicas": num_nodes, "num_cpus": 1},
        "tiers": [
            {"name": "device", "url": "device://", "capacity_bytes": args.device_mib << 20},
            {"name": "ram", "url": "ram://", "capacity_bytes": args.ram_mib << 20},
            {"name": "object", "url": f"file://{root / 'objects'}", "capacity_bytes": 8 << 30, "policy": "lru"},
        ],
        "admission": {"max_queued_per_worker": 64},
        "router": {
            "penalty_bytes_per_queued": args.penalty_mib_per_queued * (1 << 20),
            "penalty_bytes_per_token_in_flight": args.penalty_kib_per_token * (1 << 10),
        },
        "guardrails": {"canary": False},  # measured elsewhere; here it would only lengthen each start
        "data_dir": str(root / "data"),
    }


def tier_shares(outcomes: Sequence[Outcome], chunk_tokens: dict[str, int]) -> dict[str, float]:
    """Share of the requests' document tokens reused from each tier (device, ram, remote, object) and missed."""
    reused: Counter[str] = Counter()
    total = 0
    for outcome in outcomes:
        if outcome.ok and outcome.blend:
            reused.update(outcome.blend.get("reused_tokens", {}))
            total += chunk_tokens[outcome.request_id]
    # Every label the workers report is kept ("shard" is a shard read whose tier the engine did not label).
    tiers = dict.fromkeys(("device", "ram", "ssd", "remote", "object", *sorted(reused)))
    shares = {tier: round(reused[tier] / total, 4) if total else 0.0 for tier in tiers}
    shares["miss"] = round(max(0.0, 1 - sum(shares.values())), 4)
    return shares


def run_one(args: argparse.Namespace, requests: list[WorkloadRequest], num_nodes: int, policy: str, dtype: str,
            chunk_tokens: dict[str, int], bytes_per_token: int) -> dict[str, Any]:
    """A fresh loopback cluster of `num_nodes` worker nodes (plus a head without CPUs), the app, the workload."""
    import ray
    from ray import serve
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from cluster.bench.cluster import build_policy_app

    root = Path(tempfile.mkdtemp(prefix=f"mn{num_nodes}{policy[:2]}-", dir=args.scratch))
    os.environ["TMPDIR"] = str(root)
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import; the env var covers Ray's children
    node_args = {"object_store_memory": 100 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "num_cpus": 0, "temp_dir": str(root / "ray")})
    started = time.monotonic()
    try:
        for _ in range(num_nodes):
            cluster.add_node(**node_args, num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="blendserve")
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_policy_app(app_config(args, num_nodes, root, dtype), policy, args.seed), name="blendserve",
                  route_prefix="/", blocking=False)
        url = f"http://127.0.0.1:{port}"
        _wait_workers(url, num_nodes)
        start_s = time.monotonic() - started
        outcomes, duration_s = asyncio.run(_send_all(url, requests, args))
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    done = [o for o in outcomes if o.ok]
    shares = tier_shares(outcomes, chunk_tokens)
    remote_tokens = sum((o.blend or {}).get("reused_tokens", {}).get("remote", 0) for o in done)
    return {
        "nodes": num_nodes, "policy": policy, "start_s": round(start_s, 1), "duration_s": round(duration_s, 2),
        "num_requests": len(outcomes), "num_ok": len(done),
        "throughput_req_s": round(len(done) / duration_s, 4) if duration_s else 0.0,
        "hit_rate": shares, "local_hit_rate": round(shares["device"] + shares["ram"] + shares["ssd"], 4),
        "remote_bytes": remote_tokens * bytes_per_token,
        "ttft_s": percentiles(o.ttft_s for o in done),
        "server_ttft_s": percentiles(o.blend["ttft_s"] for o in done if o.blend),
        "e2e_s": percentiles(o.latency_s for o in done),
        "requests_per_worker": dict(Counter((o.blend or {}).get("worker", "?") for o in done)),
        "timeline": reuse_timeline(outcomes, 30.0),
        "requests": [{**o.to_json(), "document_tokens": chunk_tokens[o.request_id]} for o in outcomes],
        "errors": [o.error for o in outcomes if not o.ok][:5],
    }


async def _send_all(url: str, requests: list[WorkloadRequest], args: argparse.Namespace) -> tuple[list[Outcome], float]:
    async def send(session: aiohttp.ClientSession, request: WorkloadRequest) -> Outcome:
        return await blendserve_completion(session, url, MODEL, request.question, list(request.documents),
                                           args.max_tokens)

    async with aiohttp.ClientSession(timeout=DEFAULT_TIMEOUT, connector=aiohttp.TCPConnector(limit=0)) as session:
        return await drive(send, session, requests, LoadPoint(rate_rps=args.rate), 1.0, args.seed)


def _wait_workers(url: str, num_workers: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if f"blendserve_workers_ready {float(num_workers)}" in httpx.get(f"{url}/metrics", timeout=10).text:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{num_workers} workers were not ready within {READY_TIMEOUT_S} s")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--nodes", default="2,3")
    parser.add_argument("--policies", default=",".join(ROUTING_POLICIES))
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--rate", type=float, default=0.4, help="Poisson arrivals, requests/s")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--engine", choices=("torch", "vllm"), default="torch")
    parser.add_argument("--device-mib", type=int, default=96)
    parser.add_argument("--ram-mib", type=int, default=192)
    weights = RouterWeights()
    parser.add_argument("--penalty-mib-per-queued", type=float, default=weights.penalty_bytes_per_queued / (1 << 20),
                        help="affinity's load penalty per queued request, in MiB of cached KV it must outweigh")
    parser.add_argument("--penalty-kib-per-token", type=float,
                        default=weights.penalty_bytes_per_token_in_flight / (1 << 10),
                        help="affinity's load penalty per token in flight, in KiB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp"), help="short folder for Ray's sockets")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.pop("RAY_ADDRESS", None)

    model_path = prepare_default_model()
    dtype = resolve_dtype("auto", model_path)
    model, tokenizer = load_model_card(model_path)
    bytes_per_token = model.num_layers * 2 * model.num_kv_heads * model.head_dim * dtype_width_bytes(dtype)
    requests = read_workload(args.workload, args.num_requests)
    chunk_tokens = {
        r.id: sum(len(tokenizer(d + "\n\n", add_special_tokens=False).input_ids) for d in r.documents) for r in requests
    }
    document: dict[str, Any] = {
        "command": "python " + " ".join(["bench/serve_multinode.py", *(argv or os.sys.argv[1:])]),
        "machine": {**measured_on(dtype), "num_cpus": os.cpu_count()},
        "engine": args.engine, "dtype": dtype, "bytes_per_token": bytes_per_token,
        "workload": str(args.workload), "num_requests": len(requests), "rate_rps": args.rate,
        "max_tokens": args.max_tokens, "device_bytes": args.device_mib << 20, "ram_bytes": args.ram_mib << 20,
        "penalty_mib_per_queued": args.penalty_mib_per_queued, "penalty_kib_per_token": args.penalty_kib_per_token,
        "runs": [],
    }
    if args.out.exists():
        document["runs"] = json.loads(args.out.read_text()).get("runs", [])
    done = {(r["nodes"], r["policy"]) for r in document["runs"]}
    for num_nodes in (int(n) for n in args.nodes.split(",")):
        for policy in args.policies.split(","):
            if (num_nodes, policy) in done:
                continue
            _log.info("multinode: %d nodes, %s", num_nodes, policy)
            run = run_one(args, requests, num_nodes, policy, dtype, chunk_tokens, bytes_per_token)
            _log.info("multinode: %d nodes, %s: hit %s, ttft %s", num_nodes, policy, run["hit_rate"], run["ttft_s"])
            document["runs"].append(run)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
