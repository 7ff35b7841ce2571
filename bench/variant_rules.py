"""How many chunk variants each creation rule makes and how many reads they serve, replayed without a model.

A workload's requests go through one VariantIndex per rule in order, as one worker would serve them: per
request, each chunk after the first is served by a variant if one fits its preceding chunks at min_score, then
the rule decides whether one is made (as write-back does). Every chunk is taken to pass the impact gate
(`create_above`), so the counts made are upper bounds; the model-run figures per served read are
bench/variant_payoff.py's. Chunks are keyed by their text's digest.
"""
import argparse
import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from cluster.bench.workload import WorkloadRequest, read_workload
from workers.chunks.variants import Variant, VariantIndex, VariantRules


def replay(requests: list[WorkloadRequest], rules: VariantRules) -> dict[str, Any]:
    """Reads after a first chunk, the variants that served them, variants made and dropped at the per-chunk bound."""
    index = VariantIndex(rules)
    reads = served = made = dropped = 0
    seen: set[str] = set()
    for request in requests:
        keys = [hashlib.sha256(document.encode()).hexdigest() for document in request.documents]
        for position, key in enumerate(keys):
            before = keys[:position]
            if before and key in seen:  # a first sight is computed in full, not read
                reads += 1
                served += index.best(key, before) is not None
            if index.worth_creating(key, before, impact=1.0):
                made += 1
                dropped += index.add(key, Variant(tuple(before), ())) is not None
            seen.add(key)
    return {"reads": reads, "served": served, "made": made, "dropped": dropped,
            "served_per_made": round(served / made, 3) if made else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=Path, nargs="+", required=True)
    parser.add_argument("--num-requests", type=int, nargs="+", help="per workload (default: all of its requests)")
    parser.add_argument("--create-after", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    limits = args.num_requests or [None] * len(args.workloads)
    if len(limits) != len(args.workloads):
        parser.error("give --num-requests once per workload")
    results = []
    for workload, limit in zip(args.workloads, limits):
        requests = read_workload(workload)[:limit]
        for sightings in args.create_after:
            rules = replace(VariantRules(), create_after_sightings=sightings)
            results.append({"workload": str(workload), "requests": len(requests), "create_after_sightings": sightings,
                            **replay(requests, rules)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rules": asdict(VariantRules()), "results": results}, indent=1) + "\n")
    for row in results:
        print(row)


if __name__ == "__main__":
    main()
