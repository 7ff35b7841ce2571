"""Affinity's load penalty and the cache capacity against power-of-two choices at N nodes, in the simulator.

python bench/affinity_sweep.py --measured docs/results/multinode/serve_multinode.json \
    --workload /tmp/2wiki_k5_q1_proj.jsonl --nodes 3 --num-requests 300 --out docs/results/multinode/affinity_sweep.json
The service model is fitted to the measured runs (as bench/serve_simulate.py does); arrivals are Poisson at the
measured per-node rate. Each row: a capacity factor, a policy (and affinity's penalty), its device + local-shard
hit rate, the ratio of that to power-of-two's at the same capacity, and p50/p95 TTFT.
"""
import argparse
import json
import random
import statistics
from pathlib import Path

from serve_simulate import fit, sim_requests, summary

from cluster.bench.workload import read_workload
from scheduler.admission import AdmissionConfig
from scheduler.simulation.routers import AFFINITY, POWER_OF_TWO, ROUND_ROBIN, make_router
from scheduler.simulation.simulator import ClusterShape, simulate
from scheduler.weights import KiB, MiB, RouterWeights
from workers.generation.prompt import DOCUMENT_SEPARATOR
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model

PENALTIES = ((16.0, 16.0), (4.0, 4.0), (2.0, 2.0), (0.0, 0.0))  # (MiB per queued request, KiB per token in flight)
CAPACITY_FACTORS = (0.25, 0.5, 1.0, 2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=Path, required=True)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    measured = json.loads(args.measured.read_text())
    _, tokenizer = load_model_card(prepare_default_model())
    workload = read_workload(args.workload, args.num_requests)
    documents = {d for r in workload for d in r.documents}
    doc_tokens = {d: len(tokenizer(d + DOCUMENT_SEPARATOR, add_special_tokens=False).input_ids) for d in documents}
    first = measured["runs"][0]["requests"]
    other_tokens = round(statistics.median(r["prompt_tokens"] - r["document_tokens"] for r in first if r["ok"]))
    service, _ = fit(measured)
    rate_rps = measured["rate_rps"] / max(r["nodes"] for r in measured["runs"]) * args.nodes
    rng, clock, arrivals = random.Random(args.seed), 0.0, []
    for _ in workload:
        clock += rng.expovariate(rate_rps)
        arrivals.append(clock)
    requests = sim_requests(workload, arrivals, doc_tokens, other_tokens)
    admission = AdmissionConfig(max_queued_per_worker=64)
    choices = [(POWER_OF_TWO, None), (ROUND_ROBIN, None)]
    choices += [(AFFINITY, RouterWeights(penalty_bytes_per_queued=q * MiB, penalty_bytes_per_token_in_flight=t * KiB))
                for q, t in PENALTIES]
    rows = []
    for factor in CAPACITY_FACTORS:
        device_bytes, ram_bytes = (round(measured[key] * factor) for key in ("device_bytes", "ram_bytes"))
        shape = ClusterShape(args.nodes, device_bytes, ram_bytes)
        baseline = None
        for policy, weights in choices:
            result = summary(simulate(requests, shape, make_router(policy, weights, seed=args.seed), service,
                                      measured["bytes_per_token"], admission))
            baseline = baseline if baseline is not None else result["local_hit_rate"]
            rows.append({
                "capacity_factor": factor, "policy": policy,
                "penalty_mib_per_queued": weights.penalty_bytes_per_queued / MiB if weights else None,
                "penalty_kib_per_token": weights.penalty_bytes_per_token_in_flight / KiB if weights else None,
                "local_hit_rate": result["local_hit_rate"],
                "vs_power_of_two": round(result["local_hit_rate"] / baseline, 3),
                "ttft_p50_s": result["ttft_p50_s"], "ttft_p95_s": result["ttft_p95_s"],
            })
    args.out.write_text(json.dumps({"command": "python bench/affinity_sweep.py", "nodes": args.nodes,
                                    "num_requests": len(requests), "rate_rps": rate_rps,
                                    "machine": measured["machine"], "rows": rows}, indent=2) + "\n")
    print("| capacity | policy | penalty (MiB/queued, KiB/token) | device + local shard | vs p2c | p50 | p95 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        penalty = "-"
        if r["penalty_mib_per_queued"] is not None:
            penalty = f"{r['penalty_mib_per_queued']:g}, {r['penalty_kib_per_token']:g}"
        print(f"| {r['capacity_factor']:g}x | {r['policy']} | {penalty} | {r['local_hit_rate']:.3f} | "
              f"{r['vs_power_of_two']:.2f}x | {r['ttft_p50_s']:.2f} s | {r['ttft_p95_s']:.2f} s |")


if __name__ == "__main__":
    main()
