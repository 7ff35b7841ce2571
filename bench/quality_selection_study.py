"""Which selection recomputes the tokens that matter? Query-driven variants, cacheblend and oracle heuristics.

Every variant runs at the same --ratio on the same records, in one process (the torch engine by default):
full prefill answers first (the reference); each variant answers (agreement F1 with the reference) and its
fused cache is fed the reference answer (teacher-forced KL and NLL gap). Variants of query_driven vary one
choice at a time from the default (which layers' attention counts, per-layer normalisation, which question
tokens score, global or per-chunk budget, single tokens vs 16-token spans, relevance x check-layer deviation);
the oracle variants (workers/fusion/oracle.py) know the true KV and are heuristics over it, not bounds.
Writes JSON (means with 95% bootstrap intervals), prints a table.
"""
import argparse
import json
from dataclasses import replace
from pathlib import Path

from workers.evaluation.dataset import load_records
from workers.evaluation.engines import ENGINE_KINDS, load_eval_engine
from workers.evaluation.evaluate import REFERENCE_MODE, EvalRun, evaluate, summarise
from workers.evaluation.report import format_table
from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.oracle import ORACLE_WEIGHTINGS, OracleSelection
from workers.fusion.query_driven import QueryDriven, QueryScoring
from workers.fusion.registry import make_fusion_modes
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on


def variants(options: FusionOptions, num_layers: int, oracles: bool) -> dict[str, FusionMode]:
    """The strategies compared, by name."""
    base = QueryScoring()
    single = replace(options, selection_span_tokens=1)
    chosen: dict[str, FusionMode] = {
        "qd": QueryDriven(options, base),
        "qd_tokens": QueryDriven(single, base),
        "qd_raw_sum": QueryDriven(options, replace(base, layer_norm=False)),
        "qd_first_half": QueryDriven(options, replace(base, last_layer=num_layers // 2 - 1)),
        "qd_first_third": QueryDriven(options, replace(base, last_layer=num_layers // 3 - 1)),
        "qd_first_quarter": QueryDriven(options, replace(base, last_layer=num_layers // 4 - 1)),
        "qd_second_half": QueryDriven(options, replace(base, first_layer=num_layers // 2)),
        "qd_last_8_queries": QueryDriven(options, replace(base, query_tokens=8)),
        "qd_per_chunk": QueryDriven(options, replace(base, budget_split="per_chunk")),
        "qd_x_deviation": QueryDriven(options, replace(base, with_deviation=True)),
        "cacheblend_tokens": make_fusion_modes(single, ["cacheblend"])["cacheblend"],
    }
    if oracles:
        chosen |= {f"oracle_{w}": OracleSelection(single, w) for w in ORACLE_WEIGHTINGS}
    return chosen


def main() -> None:
    """Parse arguments, run every variant on every record, write the JSON, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/hotpotqa_hipporag.dev.jsonl"))
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--engine", choices=ENGINE_KINDS, default="torch")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--no-oracles", action="store_true", help="skip the oracle heuristics (a full prefill each)")
    parser.add_argument("--out", type=Path, default=Path("docs/results/scout_depth/selection_study.json"))
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO)
    parser.add_argument("--variants", help="comma-separated names of the variants to run (default: all)")
    parser.add_argument("--model", type=Path, help="a checkpoint directory (default: the default model)")
    args = parser.parse_args()
    options = FusionOptions()
    config, _ = load_model_card(args.model or prepare_default_model())
    extra = variants(options, config.num_layers, not args.no_oracles)
    if args.variants:
        wanted = args.variants.split(",")
        unknown = sorted(set(wanted) - set(extra))
        if unknown:
            parser.error(f"unknown variants {unknown}; known: {sorted(extra)}")
        extra = {name: extra[name] for name in wanted}
    access = load_eval_engine(
        args.engine, args.model, dtype=args.dtype, options=options, modes={**make_fusion_modes(options), **extra}
    )
    runs = [
        EvalRun(REFERENCE_MODE, REFERENCE_MODE, 1.0),
        EvalRun("full_reuse", "full_reuse", 0.0),
        EvalRun("cacheblend", "cacheblend", args.ratio),
    ]
    runs += [EvalRun(name, name, args.ratio) for name in extra]
    records = load_records(args.data, args.limit, args.offset)
    scores, _ = evaluate(
        access,
        records,
        runs,
        args.max_new_tokens,
        True,
        lambda i, rows: print(
            f"record {i + 1}: " + " ".join(f"{r.label} {r.tf_kl:.3f}" for r in rows if r.tf_kl is not None), flush=True
        ),
    )
    summary = summarise(scores, runs)
    result = {
        **measured_on(access.engine.dtype),
        "engine": args.engine,
        "data": str(args.data),
        "records": len(records),
        "ratio": args.ratio,
        "max_new_tokens": args.max_new_tokens,
        "modes": summary,
    }
    access.engine.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(summary))


if __name__ == "__main__":
    main()
