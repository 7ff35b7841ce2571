"""Caller side: attach context KV to a vLLM request."""
from pathlib import Path

import torch
from vllm import SamplingParams

from workers.vllm.handoff import put_kv, save_kv_file
from workers.vllm.params import ContextKVParams


def with_context_kv(sampling: SamplingParams, kv: torch.Tensor, file: Path | None = None) -> SamplingParams:
    """A copy of `sampling` that makes BlendKVConnector inject `kv` ([L, 2, T, H_kv, D]) for the first T tokens.

    The KV must be exactly what the model would hold at positions 0..T-1 of this prompt (K RoPE-rotated at
    those positions). Without `file` it is held in this process's registry (in-process engine); with `file`
    it is written there for an engine in another process.
    """
    num_tokens = kv.shape[2]
    if file is None:
        params = ContextKVParams(num_tokens, key=put_kv(kv))
    else:
        params = ContextKVParams(num_tokens, path=str(save_kv_file(kv, file)))
    extra = dict(sampling.extra_args or {})
    ours = params.as_extra_args()["kv_transfer_params"]
    extra["kv_transfer_params"] = {**extra.get("kv_transfer_params", {}), **ours}
    out = sampling.clone()
    out.extra_args = extra
    return out
