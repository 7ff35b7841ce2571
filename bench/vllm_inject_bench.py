"""Time plain vLLM prefill against vLLM with the context KV injected (python bench/vllm_inject_bench.py)."""
import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from workers.model.dtype import AUTO, DTYPE_CHOICES, measured_on, resolve_dtype, torch_dtype
from workers.vllm.engine_config import llm_kwargs, set_cpu_env

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa_hipporag.dev.jsonl"


def main() -> None:
    """Build one prompt of about --context tokens, then alternate plain and injected runs."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--context", type=int, default=3000, help="approximate context tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=AUTO, help="both sides compute in it")
    args = parser.parse_args()
    set_cpu_env(Path(tempfile.mkdtemp(prefix="blendserve-vllm-bench-")))

    import torch
    from vllm import LLM, SamplingParams

    from workers.generation.prompt import PromptTemplate
    from workers.model.checkpoint import load_checkpoint
    from workers.model.default import default_model_path
    from workers.model.runner import ModelRunner
    from workers.vllm.inject import with_context_kv

    path = default_model_path()
    dtype = resolve_dtype(args.dtype, path)
    checkpoint = load_checkpoint(path, torch_dtype(dtype))
    template = PromptTemplate(checkpoint.tokenizer)
    record, docs = None, []
    with open(DATA) as handle:
        for line in handle:
            record = json.loads(line)
            docs += [c["text"] for c in record["ctxs"]]
            layout = template.layout(docs, record["question"])
            if len(layout.token_ids) >= args.context:
                break
    ids = layout.token_ids
    n_ctx = len(ids) - len(layout.suffix_ids)
    runner = ModelRunner(checkpoint)
    start = time.perf_counter()
    with torch.inference_mode():
        cache = runner.new_cache(n_ctx)
        runner.forward(torch.tensor(ids[:n_ctx]), cache, 0)
    blend_prefill_s = time.perf_counter() - start
    kv = cache.data.clone()

    llm = LLM(**llm_kwargs(path, dtype, max_model_len=8192))
    prompt = {"prompt_token_ids": ids}
    llm.generate([{"prompt_token_ids": ids[:64]}], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
    results: dict[str, list[float]] = {"plain_ttft": [], "inject_ttft": [], "plain_gen": [], "inject_gen": []}
    texts = {}
    for _ in range(args.repeats):
        for max_tokens, suffix in ((1, "ttft"), (args.max_tokens, "gen")):
            sampling = SamplingParams(max_tokens=max_tokens, temperature=0)
            for name, sp in (("plain", sampling), ("inject", with_context_kv(sampling, kv))):
                start = time.perf_counter()
                out = llm.generate([prompt], sp, use_tqdm=False)[0]
                results[f"{name}_{suffix}"].append(time.perf_counter() - start)
                texts[name] = out.outputs[0].text
    report = {
        **measured_on(dtype),
        "prompt_tokens": len(ids),
        "context_tokens": n_ctx,
        "blendserve_context_prefill_s": round(blend_prefill_s, 3),
        "median_s": {k: round(statistics.median(v), 3) for k, v in results.items()},
        "min_s": {k: round(min(v), 3) for k, v in results.items()},
        "runs": {k: [round(x, 3) for x in v] for k, v in results.items()},
        "same_text": texts["plain"] == texts["inject"],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
