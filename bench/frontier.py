"""Quality/TTFT frontier: every fusion mode at every ratio on the same records, one engine, one run; resumable.

Per record (chunk KV stored first, not timed): full prefill answers (the reference), then each mode at each
ratio answers (timed: TTFT) and is fused again (not timed) to feed the full-prefill answer through the fusion
runner (teacher-forced KL and NLL gap). Every record's scores are appended to --rows as they finish; a rerun
skips the records already there, so a crash or a stop loses at most one record. Then the summary (means with
95% bootstrap intervals over records, TTFT medians) goes to --out and agreement F1 against TTFT to --plot.
"""
import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from frontier_plot import plot_result  # bench/ is the script's folder, first on sys.path

from workers.evaluation.arguments import add_record_arguments
from workers.evaluation.dataset import load_records
from workers.evaluation.engines import load_eval_engine
from workers.evaluation.evaluate import (
    REFERENCE_MODE,
    EvalRun,
    evaluate,
    read_rows,
    score_row,
    summarise,
)
from workers.fusion.base import FusionMode, FusionOptions
from workers.fusion.cachecraft import CacheCraft
from workers.fusion.registry import make_fusion_modes
from workers.model.dtype import measured_on

DEFAULT_MODES = "full_reuse,epic,cacheblend,cachecraft,query_driven"
DEFAULT_RATIOS = "0.05,0.1,0.15,0.2,0.3,0.5"
RATIO_FREE = {"full_reuse"}  # modes that recompute nothing whatever the ratio: run once
# Cache-Craft's ablation (docs/studies/cachecraft_ablation.md); "cachecraft" itself has both mechanisms:
# early termination and stored impacts.
CACHECRAFT_VARIANTS: dict[str, dict[str, Any]] = {  # CraftOptions changed from the given options
    "cachecraft_neither": {"stop_after": None, "stored_impact": False},  # chunk impact at layer 1 only
    "cachecraft_stop": {"stored_impact": False},  # + early termination of chunks out of the question's focus
    "cachecraft_stored": {"stop_after": None},  # + impacts stored from earlier uses
}


def modes_with_variants(options: FusionOptions) -> dict[str, FusionMode]:
    """Every registered mode, plus the Cache-Craft variants built from `options`."""
    modes = make_fusion_modes(options)
    for name, changes in CACHECRAFT_VARIANTS.items():
        modes[name] = CacheCraft(replace(options, craft=replace(options.craft, **changes)))
    return modes


def frontier_runs(modes: list[str], ratios: list[float]) -> list[EvalRun]:
    """Full prefill, then each mode at each ratio (once for the ratio-free ones), labelled MODE@RATIO."""
    runs = [EvalRun(REFERENCE_MODE, REFERENCE_MODE, 1.0)]
    for mode in modes:
        for ratio in ratios[:1] if mode in RATIO_FREE else ratios:
            runs.append(EvalRun(mode if mode in RATIO_FREE else f"{mode}@{ratio:g}", mode, ratio))
    return runs


def main() -> None:
    """Run the records not yet in --rows, then summarise every row there."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_record_arguments(parser)
    parser.add_argument("--model", type=Path, help="a checkpoint directory (default: the default model)")
    parser.add_argument("--modes", default=DEFAULT_MODES)
    parser.add_argument("--ratios", default=DEFAULT_RATIOS)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rows", type=Path, required=True, help="per-record scores, JSON lines (appended)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--summarise-only", action="store_true", help="only summarise the rows already written")
    parser.add_argument("--cachecraft-variants", action="store_true",
                        help="also offer the Cache-Craft ablation modes (CACHECRAFT_VARIANTS)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    modes = [m for m in args.modes.split(",") if m]
    runs = frontier_runs(modes, [float(r) for r in args.ratios.split(",")])
    records = load_records(args.data, args.limit, args.offset)
    done = {(row.record, row.label) for row in read_rows(args.rows)}
    todo = [(record, [run for run in runs if (record.id, run.label) not in done]) for record in records]
    todo = [(record, missing) for record, missing in todo if missing]
    if todo and not args.summarise_only:
        options = FusionOptions()
        variants = modes_with_variants(options) if args.cachecraft_variants else None
        access = load_eval_engine(args.engine, model=args.model, dtype=args.dtype, options=options, modes=variants)
        args.rows.parent.mkdir(parents=True, exist_ok=True)
        with args.rows.open("a") as handle:
            for index, (record, missing) in enumerate(todo):
                # full prefill always answers first: it is the reference; its row is written once
                scores, _ = evaluate(access, [record], [runs[0], *(r for r in missing if r != runs[0])],
                                     args.max_new_tokens, True, warm_up=index == 0)
                fresh = [row for row in scores if (row.record, row.label) not in done]
                handle.writelines(json.dumps(score_row(row)) + "\n" for row in fresh)
                handle.flush()
                print(f"record {index + 1}/{len(todo)} {record.id} "
                      + " ".join(f"{r.label} {r.agreement_f1:.2f}/{r.tf_kl:.3f}" for r in fresh), flush=True)
        dtype = access.engine.dtype
        access.engine.close()
    else:
        from workers.model.default import prepare_default_model
        from workers.model.dtype import resolve_dtype

        dtype = resolve_dtype(args.dtype, args.model or prepare_default_model(), on_gpu=False)
    wanted = {r.id for r in records}
    rows = [row for row in read_rows(args.rows) if row.record in wanted]
    summary = summarise(rows, runs)
    result = {**measured_on(dtype), "engine": args.engine, "model": str(args.model or "default"),
              "data": str(args.data),
              "records": len({row.record for row in rows}), "offset": args.offset,
              "max_new_tokens": args.max_new_tokens, "modes": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot is not None:
        plot_result(result, args.plot)
    print(
        "| run | agreement F1 [95% CI] | exact match | first-token agree | TF KL [95% CI] | TTFT median (s) "
        "| recomputed |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, row in summary.items():
        low, high = row["agreement_f1_ci95"]
        kl_low, kl_high = row.get("tf_kl_ci95", (0.0, 0.0))
        print(
            f"| {label} | {row['agreement_f1']:.3f} [{low:.3f}, {high:.3f}] | {row['exact_match']:.2f} | "
            f"{row['first_token_agreement']:.2f} | {row.get('tf_kl', 0.0):.4f} [{kl_low:.4f}, {kl_high:.4f}] | "
            f"{row['ttft_s_median']:.3f} | {row['recomputed_fraction']:.3f} |"
        )


if __name__ == "__main__":
    main()
