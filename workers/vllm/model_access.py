"""Reach the torch module vLLM loaded, through vLLM's public LLM.apply_model (no internals touched)."""
from typing import Any

import torch


def vllm_model(llm: Any) -> torch.nn.Module:
    """The model object inside an in-process vLLM engine (VLLM_ENABLE_V1_MULTIPROCESSING=0).

    LLM.apply_model runs a function on the model in each worker; in-process the returned object is the live
    module itself, sharing its weights. With multiprocessing the result would be a pickled copy instead.
    """
    models = llm.apply_model(lambda model: model)
    if len(models) != 1:
        raise RuntimeError(f"expected one worker, got {len(models)}")
    return models[0]


def vllm_state_dict(llm: Any) -> dict[str, torch.Tensor]:
    """vLLM's own parameter tensors by name (fused layouts such as qkv_proj and gate_up_proj)."""
    return dict(vllm_model(llm).named_parameters())
