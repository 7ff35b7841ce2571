"""Chunk variants in a capacity-bounded store, replayed without a model (docs/studies/variant_capacity.md).

A variant is one more entry in the chunk store, as large as its chunk's base KV, so at a bounded capacity it
can push out base chunks that later requests would have hit. This replays a workload's requests in order
through the store's admission policy (W-TinyLFU, the default) at several capacities, once without variants
and once keeping them under a creation rule, and counts per chunk read: a variant served (held and fitting at
min_score), a base hit, or a miss (computed in full and written). Every chunk is taken to pass the impact gate,
as in bench/variant_rules.py.

The work figure weighs each read by the share of it computed fresh, from the vLLM run of
bench/variant_payoff.py (docs/quality.md): a miss in full, a base hit `--hit-share` (cachecraft's recomputed
share without variants, 0.158), a read from a variant that fits by s `--hit-share` x (1 - s), as cachecraft
scales a chunk's impact by its variant's fit. Capacities are shares of the distinct chunks' tokens.
"""
import argparse
import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from cluster.bench.workload import WorkloadRequest, read_workload
from kvplane.eviction.policy import make_policy
from workers.chunks.variants import Variant, VariantIndex, VariantRules


def digest(text: str) -> str:
    """A chunk's key: its text's digest."""
    return hashlib.sha256(text.encode()).hexdigest()


def variant_key(chunk_key: str, before: tuple[str, ...] | list[str]) -> str:
    """A variant's store key: its chunk's and its preceding chunks'."""
    return chunk_key + ":" + digest("|".join(before))


def replay(
    requests: list[WorkloadRequest], tokens: dict[str, int], capacity_tokens: int, rules: VariantRules | None,
    hit_share: float, policy_name: str = "tinylfu",
) -> dict[str, Any]:
    """Reads by outcome (variant, base hit, miss), variants made and evicted, and the work, at one capacity."""
    policy = make_policy(policy_name, capacity_tokens)
    index = VariantIndex(rules) if rules is not None else None
    counts = {"reads": 0, "variant_reads": 0, "base_hits": 0, "misses": 0, "made": 0}
    read_tokens = miss_tokens = work_tokens = 0.0
    made_keys: set[str] = set()
    for request in requests:
        keys = [digest(document) for document in request.documents]
        for position, key in enumerate(keys):
            before, size = keys[:position], tokens[key]
            counts["reads"] += 1
            read_tokens += size
            found = index.best(key, before) if index is not None and before else None
            held = variant_key(key, found[0].before) if found is not None else None
            if found is not None and policy.contains(held):
                counts["variant_reads"] += 1
                work_tokens += size * hit_share * (1.0 - found[1])
                policy.touch(held)
            elif policy.contains(key):
                counts["base_hits"] += 1
                work_tokens += size * hit_share
                policy.touch(key)
            else:  # a miss: computed in full and written back (an evicted variant falls back to its chunk)
                counts["misses"] += 1
                miss_tokens += size
                work_tokens += size
                policy.touch(key)
                policy.admit(key, size, 1.0)
            if index is not None and index.worth_creating(key, before, impact=1.0):
                made = variant_key(key, before)
                counts["made"] += 1
                made_keys.add(made)
                policy.admit(made, size, 1.0)
                dropped = index.add(key, Variant(tuple(before), ()))
                if dropped is not None:
                    policy.remove(variant_key(key, dropped.before))
    return {**counts, "variants_held_at_end": sum(policy.contains(key) for key in made_keys),
            "token_hit_rate": round(1.0 - miss_tokens / read_tokens, 4),
            "work_share": round(work_tokens / read_tokens, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--capacities", default="0.05,0.1,0.2,0.4,1.0",
                        help="comma-separated shares of the distinct chunks' tokens")
    parser.add_argument("--create-after", type=int, default=VariantRules().create_after_sightings)
    parser.add_argument("--hit-share", type=float, default=0.158)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from transformers import AutoTokenizer  # the default model's tokenizer sizes the chunks

    from workers.model.default import prepare_default_model

    tokenizer = AutoTokenizer.from_pretrained(prepare_default_model())
    requests = read_workload(args.workload)[: args.num_requests]
    texts = {digest(d): d for request in requests for d in request.documents}
    tokens = {key: len(tokenizer(text)["input_ids"]) for key, text in texts.items()}
    rules = replace(VariantRules(), create_after_sightings=args.create_after)
    results = []
    for share in (float(c) for c in args.capacities.split(",")):
        capacity = max(1, int(share * sum(tokens.values())))
        for name, variant_rules in (("no_variants", None), ("variants", rules)):
            row = replay(requests, tokens, capacity, variant_rules, args.hit_share)
            results.append({"capacity_share": share, "run": name, **row})
            print(json.dumps(results[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"workload": str(args.workload), "requests": len(requests),
                                    "distinct_chunks": len(tokens), "distinct_tokens": sum(tokens.values()),
                                    "rules": asdict(rules), "hit_share": args.hit_share, "results": results},
                                   indent=1) + "\n")


if __name__ == "__main__":
    main()
