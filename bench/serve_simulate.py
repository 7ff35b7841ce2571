"""Fit the cluster simulator to the measured multi-node runs, check it on them, and project 8 to 64 nodes.

python bench/serve_simulate.py --measured docs/results/multinode/serve_multinode.json \
    --workload docs/results/workloads/2wiki_k5_q1.jsonl --out docs/results/multinode/serve_simulation.json
The projection workload is the same retrieval workload drawn again with more requests (--projection-workload).
"""
import argparse
import hashlib
import json
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster.bench.workload import WorkloadRequest, read_workload
from scheduler.admission import AdmissionConfig
from scheduler.simulation.fit import Observation, fit_service_model
from scheduler.simulation.routers import ROUTING_POLICIES, make_router
from scheduler.simulation.simulator import (
    DEVICE,
    LOCAL,
    OBJECT,
    REMOTE,
    ClusterShape,
    ServiceModel,
    SimRequest,
    simulate,
)
from scheduler.weights import KiB, MiB, RouterWeights
from workers.generation.prompt import DOCUMENT_SEPARATOR
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model

# "shard" is a shard read the engine did not label local or remote; its cost is fitted with the local shard's.
TIER_OF = {"device": DEVICE, "ram": LOCAL, "ssd": LOCAL, "shard": LOCAL, "remote": REMOTE, "object": OBJECT}
SHARD_LABELS = ("ram", "ssd", "shard", "remote")
NODE_COUNTS = (2, 3, 8, 16, 32, 64)
CAPACITY_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


def chunk_key(document: str) -> str:
    """A stand-in for the chunk key: the same document always gets the same key."""
    return hashlib.sha1(document.encode()).hexdigest()


def alone(requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests that found no other request of theirs in flight on their worker when they were sent."""
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for request in requests:
        if request["ok"] and request["blend"]:
            by_worker.setdefault(request["blend"]["worker"], []).append(request)
    found = []
    for mine in by_worker.values():
        for request in mine:
            busy = any(
                o is not request and o["sent_s"] < request["sent_s"] < o["sent_s"] + o["latency_s"] for o in mine
            )
            if not busy:
                found.append(request)
    return found


def fit(measured: dict[str, Any]) -> tuple[ServiceModel, int]:
    """The service model fitted to every measured run's idle-worker requests; (model, observations used)."""
    requests = [r for run in measured["runs"] for r in run["requests"]]
    chosen = alone(requests)
    observations = []
    for r in chosen:
        reused: dict[str, int] = {}
        for tier, tokens in r["blend"]["reused_tokens"].items():
            reused[TIER_OF[tier]] = reused.get(TIER_OF[tier], 0) + tokens
        observations.append(Observation(float(r["blend"]["recomputed_tokens"]), r["ttft_s"], reused))
    decode_s = statistics.median(r["latency_s"] - r["ttft_s"] for r in requests if r["ok"])
    ratio = measured.get("recompute_ratio", 0.15)
    return fit_service_model(observations, decode_s, ratio, measured.get("engine") == "torch"), len(observations)


def sim_requests(
    requests: Sequence[WorkloadRequest], arrivals_s: Sequence[float], doc_tokens: dict[str, int], other_tokens: int
) -> list[SimRequest]:
    """The workload's requests at the given arrival times, chunks keyed by content."""
    return [
        SimRequest(at, tuple((chunk_key(d), doc_tokens[d]) for d in r.documents), other_tokens)
        for r, at in zip(requests, arrivals_s)
    ]


def summary(result: Any) -> dict[str, Any]:
    rates = result.hit_rates()
    return {
        "hit_rate": rates,
        "local_hit_rate": round(rates[DEVICE] + rates[LOCAL], 4),
        "device_hit_rate": rates[DEVICE],
        "shard_hit_rate": round(rates[LOCAL] + rates[REMOTE], 4),
        "ttft_p50_s": round(result.ttft_quantile(0.5), 4),
        "ttft_p95_s": round(result.ttft_quantile(0.95), 4),
        "remote_bytes": result.remote_bytes(),
        "num_rejected": result.num_rejected,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=Path, required=True)
    parser.add_argument("--workload", type=Path, required=True, help="the workload the measured runs sent")
    parser.add_argument("--projection-workload", type=Path, help="default: --workload")
    parser.add_argument("--requests-per-node", type=int, default=100)
    parser.add_argument("--capacity-nodes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    measured = json.loads(args.measured.read_text())
    _, tokenizer = load_model_card(prepare_default_model())
    workload = read_workload(args.workload, measured["num_requests"])
    projection = read_workload(args.projection_workload or args.workload)
    doc_tokens = {
        d: len(tokenizer(d + DOCUMENT_SEPARATOR, add_special_tokens=False).input_ids)
        for r in (*workload, *projection)
        for d in r.documents
    }
    first = measured["runs"][0]["requests"]
    other_tokens = round(statistics.median(r["prompt_tokens"] - r["document_tokens"] for r in first if r["ok"]))
    service, num_observations = fit(measured)
    default = RouterWeights()  # the measured runs' affinity penalty, where they recorded one
    weights = RouterWeights(
        penalty_bytes_per_queued=measured.get("penalty_mib_per_queued", default.penalty_bytes_per_queued / MiB) * MiB,
        penalty_bytes_per_token_in_flight=measured.get(
            "penalty_kib_per_token", default.penalty_bytes_per_token_in_flight / KiB) * KiB,
    )
    bytes_per_token = measured["bytes_per_token"]
    admission = AdmissionConfig(max_queued_per_worker=64)

    def shape(nodes: int, factor: float = 1.0) -> ClusterShape:
        return ClusterShape(nodes, round(measured["device_bytes"] * factor), round(measured["ram_bytes"] * factor))

    checks = []
    for run in measured["runs"]:
        arrivals = {r["id"]: r["sent_s"] for r in run["requests"]}
        requests = sim_requests(workload, [arrivals[r.id] for r in workload], doc_tokens, other_tokens)
        simulated = summary(
            simulate(
                requests,
                shape(run["nodes"]),
                make_router(run["policy"], weights, seed=args.seed),
                service,
                bytes_per_token,
                admission,
            )
        )
        checks.append(
            {
                "nodes": run["nodes"],
                "policy": run["policy"],
                "simulated": simulated,
                "measured": {
                    "hit_rate": run["hit_rate"],
                    "local_hit_rate": run["local_hit_rate"],
                    "device_hit_rate": run["hit_rate"]["device"],
                    "shard_hit_rate": round(sum(run["hit_rate"].get(t, 0.0) for t in SHARD_LABELS), 4),
                    "ttft_p50_s": run["ttft_s"].get("p50"),
                    "ttft_p95_s": run["ttft_s"].get("p95"),
                    "remote_bytes": run["remote_bytes"],
                },
            }
        )

    per_node_rate = measured["rate_rps"] / max(r["nodes"] for r in measured["runs"])
    rng = random.Random(args.seed)

    def projected_requests(nodes: int) -> list[SimRequest]:
        count = nodes * args.requests_per_node
        picks = (
            [projection[rng.randrange(len(projection))] for _ in range(count)]
            if count > len(projection)
            else projection[:count]
        )
        clock, arrivals = 0.0, []
        for _ in picks:
            clock += rng.expovariate(per_node_rate * nodes)
            arrivals.append(clock)
        return sim_requests(picks, arrivals, doc_tokens, other_tokens)

    by_nodes = []
    for nodes in NODE_COUNTS:
        requests = projected_requests(nodes)
        for policy in ROUTING_POLICIES:
            result = simulate(
                requests, shape(nodes), make_router(policy, weights, seed=args.seed), service, bytes_per_token,
                admission,
            )
            by_nodes.append({"nodes": nodes, "policy": policy, **summary(result)})
    by_capacity = []
    requests = projected_requests(args.capacity_nodes)
    for factor in CAPACITY_FACTORS:
        for policy in ROUTING_POLICIES:
            result = simulate(
                requests,
                shape(args.capacity_nodes, factor),
                make_router(policy, weights, seed=args.seed),
                service,
                bytes_per_token,
                admission,
            )
            by_capacity.append(
                {
                    "nodes": args.capacity_nodes,
                    "device_bytes": round(measured["device_bytes"] * factor),
                    "ram_bytes": round(measured["ram_bytes"] * factor),
                    "policy": policy,
                    **summary(result),
                }
            )
    document = {
        "command": "python bench/serve_simulate.py " + " ".join(argv or __import__("sys").argv[1:]),
        "machine": measured["machine"],
        "service_model": {
            "base_s": service.base_s,
            "compute_s_per_token": service.compute_s_per_token,
            "reuse_s_per_token": dict(service.reuse_s_per_token),
            "decode_s": service.decode_s,
            "recompute_ratio": service.recompute_ratio,
            "serial_decode": service.serial_decode,
            "observations": num_observations,
        },
        "other_tokens": other_tokens,
        "per_node_rate_rps": per_node_rate,
        "requests_per_node": args.requests_per_node,
        "check": checks,
        "by_nodes": by_nodes,
        "by_capacity": by_capacity,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    for row in checks:
        print(
            row["nodes"],
            row["policy"],
            "sim",
            row["simulated"]["device_hit_rate"],
            row["simulated"]["shard_hit_rate"],
            row["simulated"]["ttft_p95_s"],
            "measured",
            row["measured"]["device_hit_rate"],
            row["measured"]["shard_hit_rate"],
            row["measured"]["ttft_p95_s"],
        )


if __name__ == "__main__":
    main()
