"""Does the check layer's KV deviation rank tokens like the deviation deep in the model? Spearman, per dtype.

For each record (torch runner, chunk KV computed after the prompt prefix, as served): the cached KV is placed,
a full prefill gives the true KV, and cacheblend's check-layer deviation (layer 1's fresh K/V after layer 0 is
recomputed for every token, against the cached ones) is taken. Over the tokens a selection may choose (reused,
past the exact prefix and first chunk), the Spearman rank correlation of that check deviation with the true
deviation at each layer, with the true deviation summed over layers and with its per-layer normalised sum;
and of the true layer-1 deviation with the deeper ones. Writes JSON, prints a table.
"""
import argparse
import json
import statistics
from pathlib import Path

import torch

from workers.evaluation.dataset import load_records
from workers.evaluation.rank_correlation import spearman
from workers.fuser import Fuser
from workers.fusion.cacheblend import step_deviation
from workers.fusion.layout import BlendLayout
from workers.fusion.oracle import layer_kv_error, per_layer_normalised
from workers.fusion.query_driven import selectable_mask
from workers.fusion.selective_pass import LayerStep, selective_prefill
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import measured_on
from workers.model.runner import ModelRunner

CHECK_LAYER = 1


class _Stop(Exception):
    """Ends the pass once the check layer's deviation is known."""


def check_deviation(runner: ModelRunner, fuser: Fuser, layout: BlendLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(cacheblend's check-layer deviation [N], the true per-layer deviation [L, N]) of one prompt."""
    cache = runner.new_cache(layout.kv_end)
    layout.load_cached(cache, runner.rerotate_keys)
    cached = cache.data.clone()
    reference = runner.new_cache(layout.kv_end)
    runner.forward(layout.token_ids[: layout.kv_end], reference, 0)
    truth = layer_kv_error(reference.data, cached)  # [L, N]
    seen: list[torch.Tensor] = []

    def narrow(step: LayerStep) -> None:
        if step.layer == CHECK_LAYER:
            seen.append(step_deviation(step, fuser.options.deviation_metric))
            raise _Stop
        return None

    try:
        selective_prefill(runner, layout, cache, torch.arange(layout.kv_end), narrow)
    except _Stop:
        pass
    return seen[0], truth


def main() -> None:
    """Parse arguments, measure per dtype, write the JSON, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/hotpotqa_hipporag.dev.jsonl"))
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--layers", default="1,2,4,8,16,29")
    parser.add_argument("--out", type=Path, default=Path("docs/results/rank_correlation/rank_correlation.json"))
    args = parser.parse_args()
    deep = [int(x) for x in args.layers.split(",")]
    result: dict = {"data": str(args.data), "check_layer": CHECK_LAYER, "by_dtype": {}}
    for name in args.dtypes.split(","):
        runner = ModelRunner(load_checkpoint(prepare_default_model(), getattr(torch, name)))
        fuser = Fuser(runner)
        rows = []
        with torch.inference_mode():
            for record in load_records(args.data, args.limit):
                prompt = fuser.layout(record.documents, record.question)
                fuser.precompute(prompt)
                layout = fuser._lookup(prompt, True, "default", 0.15, len(prompt.token_ids)).layout
                check, truth = check_deviation(runner, fuser, layout)
                free = selectable_mask(layout)
                check, truth = check[free], truth[:, free]
                row = {f"check_vs_layer{layer}": spearman(check, truth[layer]) for layer in deep}
                row |= {f"true_layer1_vs_layer{layer}": spearman(truth[1], truth[layer]) for layer in deep[1:]}
                row["check_vs_sum"] = spearman(check, truth.sum(dim=0))
                row["check_vs_per_layer_sum"] = spearman(check, per_layer_normalised(truth))
                rows.append(row)
                print(name, record.id, " ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
        result["by_dtype"][name] = {**measured_on(runner.dtype), "records": len(rows),
                                    "mean": {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    keys = list(next(iter(result["by_dtype"].values()))["mean"])
    print("| Spearman (mean over records) | " + " | ".join(result["by_dtype"]) + " |")
    print("|---|" + "---|" * len(result["by_dtype"]))
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{d['mean'][key]:.3f}" for d in result["by_dtype"].values()) + " |")


if __name__ == "__main__":
    main()
