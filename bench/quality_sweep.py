"""Agreement F1 and TTFT of cacheblend and epic against the recompute ratio, measured in one run; writes JSON + PNG."""
import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from workers.engines.torch_engine import load_torch_engine  # noqa: E402
from workers.evaluation.dataset import load_records  # noqa: E402
from workers.evaluation.evaluate import EvalRun, evaluate  # noqa: E402
from workers.fusion.base import FusionOptions  # noqa: E402
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on  # noqa: E402

DEFAULT_RATIOS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


def main() -> None:
    """Parse arguments, run the sweep, write the result and the plot."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--modes", default="cacheblend,epic")
    parser.add_argument("--ratios", default=",".join(str(r) for r in DEFAULT_RATIOS))
    parser.add_argument("--out", type=Path, default=Path("docs/quality_sweep.json"))
    parser.add_argument("--plot", type=Path, default=Path("docs/quality_sweep.png"))
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO, help="compute dtype (auto: by the CPU)")
    args = parser.parse_args()
    modes, ratios = args.modes.split(","), [float(r) for r in args.ratios.split(",")]
    runs = [EvalRun("full_prefill", "full_prefill", 1.0)]
    runs += [EvalRun(f"{m}@{r}", m, r) for m in modes for r in ratios]
    # as docs/quality.md was measured: single tokens, gradual filtering
    engine = load_torch_engine(
        dtype=args.dtype, options=FusionOptions(selection_span_tokens=1).with_gradual_filtering()
    )
    records = load_records(args.data, args.limit)
    summaries, _ = evaluate(engine, records, runs)
    result = {
        **measured_on(engine.dtype),
        "data": str(args.data),
        "records": len(records),
        "ratios": ratios,
        "runs": summaries,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, modes, args.plot)


def plot(result: dict, modes: list[str], path: Path) -> None:
    """Two panels: agreement F1 and median TTFT against ratio, full prefill's TTFT as a line."""
    fig, (ax_f1, ax_ttft) = plt.subplots(1, 2, figsize=(10, 4))
    ratios = result["ratios"]
    for mode in modes:
        rows = [result["runs"][f"{mode}@{r}"] for r in ratios]
        ax_f1.plot(ratios, [row["agreement_f1"] for row in rows], marker="o", label=mode)
        ax_ttft.plot(ratios, [row["ttft_s_median"] for row in rows], marker="o", label=mode)
    ax_ttft.axhline(result["runs"]["full_prefill"]["ttft_s_median"], color="gray", linestyle="--", label="full_prefill")
    ax_f1.set(xlabel="recompute ratio", ylabel="agreement F1 vs full prefill", ylim=(0, 1.05))
    ax_ttft.set(xlabel="recompute ratio", ylabel="TTFT median (s)")
    for ax in (ax_f1, ax_ttft):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{Path(result['data']).name}, {result['records']} records, SmolLM2-135M bf16, 2 CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
