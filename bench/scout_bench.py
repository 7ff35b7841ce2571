"""Time query_driven's scout attention (workers.fusion.query_driven.scout_attention) at musique's shapes.

60 question tokens over 6.2k cached context keys, SmolLM2-135M's 9 heads / 3 KV heads / head_dim 64, bf16:
one layer of the scout's attention, median of --calls. To compare two versions, run it in each checkout.
"""
import argparse
import statistics
import time

import torch

from workers.fusion.query_driven import scout_attention

NUM_QUERIES, NUM_KEYS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 60, 6200, 9, 3, 64


def median_ms(calls: int, threads: int) -> float:
    """Median wall time of one scout attention call, in milliseconds."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16
    q = torch.randn(NUM_QUERIES, NUM_HEADS, HEAD_DIM).to(dtype)
    k, v = (torch.randn(NUM_QUERIES, NUM_KV_HEADS, HEAD_DIM).to(dtype) for _ in range(2))
    context_k, context_v = (torch.randn(NUM_KEYS, NUM_KV_HEADS, HEAD_DIM).to(dtype) for _ in range(2))
    own = torch.ones(NUM_QUERIES, NUM_QUERIES, dtype=torch.bool).tril()
    scout_attention(q, k, v, context_k, context_v, own, HEAD_DIM**-0.5)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        scout_attention(q, k, v, context_k, context_v, own, HEAD_DIM**-0.5)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"scout attention, {NUM_QUERIES} queries x {NUM_KEYS} keys, bf16, cpu {capability}, "
          f"{args.threads} threads: {median_ms(args.calls, args.threads):.2f} ms")


if __name__ == "__main__":
    main()
