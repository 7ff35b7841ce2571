"""How high can agreement F1 go on this model? The vLLM engine's answers against plain vLLM's, in one run.

For each record (musique_cacheblend.dev by default; chunks reversed, as in bench/vllm_bench.py), in one process:
- plain vLLM with prefix caching answers the prompt (the reference), then the exact prompt again (served
  from its prefix cache: the noise floor, the same prompt through another order of bf16 operations);
- the vLLM engine answers with cacheblend at each --ratios value (the default one check layer, 16-token spans);
- the vLLM engine answers with query_driven at each --ratios value;
- the vLLM engine answers with each oracle heuristic at --oracle-ratio (workers/fusion/oracle.py: tokens
  ranked by the true KV error raw, per-layer normalised, weighted by the question's attention, or
  iteratively; single tokens). They know the true KV but are heuristics, not bounds.
Agreement F1 = token F1 of an answer against the reference answer (greedy, --max-tokens). Writes JSON, prints
a table.
"""
import argparse
import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from vllm_bench import KV_CACHE_BYTES, PlainVLLM, _blended, _median, _text

from workers.evaluation.dataset import load_records
from workers.evaluation.scoring import token_f1
from workers.fuser import Fuser
from workers.fusion.base import FusionOptions
from workers.fusion.oracle import ORACLE_WEIGHTINGS, OracleSelection
from workers.fusion.registry import make_fusion_modes
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype
from workers.vllm.engine_config import set_cpu_env
from workers.vllm.settings import VLLMSettings


def _runs(ratios: list[float], oracle_ratio: float) -> list[tuple[str, str, float]]:
    """(system name, engine mode, ratio) in the order they run."""
    blended = [(f"{mode}@{ratio:g}", mode, ratio) for mode in ("cacheblend", "query_driven") for ratio in ratios]
    oracle = [(f"oracle_{name}@{oracle_ratio:g}", f"oracle_{name}", oracle_ratio) for name in ORACLE_WEIGHTINGS]
    return blended + oracle


def main() -> None:
    """Parse arguments, run every system on every record, write the JSON, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/musique_cacheblend.dev.jsonl"))
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument(
        "--ratios", type=lambda text: [float(x) for x in text.split(",")], default=[0.15, 0.3, 0.5, 1.0]
    )
    parser.add_argument("--oracle-ratio", type=float, default=0.15)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("docs/results/vllm_agreement_study/vllm_agreement_study.json"))
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO, help="compute dtype (auto: by the CPU)")
    args = parser.parse_args()

    from workers.vllm.engine import VLLMEngine

    model = prepare_default_model()
    dtype = resolve_dtype(args.dtype, model)
    scratch = Path(tempfile.mkdtemp(prefix="blendserve-agreement-"))
    set_cpu_env(scratch)  # before vllm is imported
    plain = PlainVLLM(model, 8192, dtype)
    options = FusionOptions()
    single = replace(options, selection_span_tokens=1)
    modes = {**make_fusion_modes(options), **{f"oracle_{w}": OracleSelection(single, w) for w in ORACLE_WEIGHTINGS}}
    settings = VLLMSettings(max_model_len=8192, kv_cache_bytes=KV_CACHE_BYTES)
    engine = VLLMEngine.start(model, scratch, settings, dtype, lambda runner: Fuser(runner, options, modes=modes))
    stop = list(engine.stop_token_ids)
    runs = _runs(args.ratios, args.oracle_ratio)
    rows: list[dict[str, Any]] = []
    for record in load_records(args.data, args.limit, args.offset):
        docs = list(record.documents)
        engine.store_documents(docs, "default")
        reordered = docs[::-1]
        prompt_ids = engine.fuser.layout(reordered, record.question).token_ids
        reference = plain.run(prompt_ids, args.max_tokens, stop)
        repeat = plain.run(prompt_ids, args.max_tokens, stop)
        reference_text = _text(engine, reference["tokens"])
        row: dict[str, Any] = {
            "id": record.id,
            "reference": reference_text,
            "plain_repeat": {"agreement_f1": token_f1(_text(engine, repeat["tokens"]), reference_text)},
        }
        for name, mode, ratio in runs:
            out = _blended(engine, reordered, record.question, ratio, args.max_tokens, mode)
            answer = _text(engine, out["tokens"])
            row[name] = {"agreement_f1": token_f1(answer, reference_text), "ttft_s": out["ttft_s"], "answer": answer}
        rows.append(row)
        print(
            record.id,
            " ".join(f"{name} {row[name]['agreement_f1']:.2f}" for name in row if name not in ("id", "reference")),
            flush=True,
        )
    names = ["plain_repeat", *(name for name, _, _ in runs)]
    systems = {
        name: {
            "agreement_f1_mean": statistics.mean(r[name]["agreement_f1"] for r in rows),
            "identical_answers": sum(r[name]["agreement_f1"] == 1.0 for r in rows),
            "ttft_s_median": _median([r[name].get("ttft_s") for r in rows]),
        }
        for name in names
    }
    result = {
        **measured_on(dtype),
        "data": str(args.data),
        "records": len(rows),
        "offset": args.offset,
        "max_tokens": args.max_tokens,
        "systems": systems,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| system | agreement F1 (mean) | identical answers | TTFT median (s) |\n|---|---|---|---|")
    for name, s in systems.items():
        ttft = f"{s['ttft_s_median']:.2f}" if s["ttft_s_median"] is not None else "-"
        print(f"| {name} | {s['agreement_f1_mean']:.3f} | {s['identical_answers']}/{len(rows)} | {ttft} |")


if __name__ == "__main__":
    main()
