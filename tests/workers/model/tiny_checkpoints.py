"""Tiny random checkpoints of every supported family, built with transformers, for parity tests of the runner."""
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from workers.model.default import prepare_default_model

# vocab_size is the default tokenizer's, so its tokenizer files can be copied into every tiny checkpoint.
TINY_SHAPES: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 49152,
    "max_position_embeddings": 512,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SEED = 1234

# family name -> (config class, model class, config options beyond TINY_SHAPES)
FAMILIES: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel], dict[str, Any]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM, {"rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "llama_tied": (LlamaConfig, LlamaForCausalLM, {"tie_word_embeddings": True}),
    "llama3_rope": (
        LlamaConfig,
        LlamaForCausalLM,
        {
            # original context 64 puts this head_dim's wavelengths in all three llama3 bands (kept, blended, scaled).
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "linear_rope": (
        LlamaConfig,
        LlamaForCausalLM,
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}},
    ),
    # one sliding-window layer (8 tokens, so the test prompts cross it) and one global layer, each with its own
    # RoPE base; an attention scalar other than head_dim, so a wrong logit scale shows
    "gemma3": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        {
            "head_dim": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 8,
            "query_pre_attn_scalar": 24,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
        },
    ),
}


def build_tiny_model(family: str, **overrides: Any) -> PreTrainedModel:
    """A seeded random float32 model of the family, in eval mode, with O(1) activations and attention scores."""
    config_class, model_class, options = FAMILIES[family]
    config = config_class(**{**TINY_SHAPES, **options, **overrides})
    torch.manual_seed(SEED)
    model = model_class(config).to(torch.float32).eval()
    _reinitialize(model)
    return model


@torch.no_grad()
def _reinitialize(model: PreTrainedModel) -> None:
    """Replace the tiny default init (std 0.02) so that RoPE, biases and norms visibly change the logits."""
    generator = torch.Generator().manual_seed(SEED)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        if name.endswith("norm.weight"):
            param.copy_(1.0 + 0.1 * noise)
        elif name.endswith("bias"):
            param.copy_(0.5 * noise)
        elif name.endswith("embed_tokens.weight"):
            param.copy_(noise)
        else:
            param.copy_(noise / math.sqrt(param.shape[-1]))


def save_tiny_checkpoint(model: PreTrainedModel, directory: Path) -> Path:
    """Write the model as float32 safetensors plus the default tokenizer's files; return the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer_source = prepare_default_model()
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_source / name, directory / name)
    return directory


def tiny_checkpoint(family: str, directory: Path, **overrides: Any) -> tuple[PreTrainedModel, Path]:
    """Build and save one tiny checkpoint; return the transformers model and its directory."""
    model = build_tiny_model(family, **overrides)
    return model, save_tiny_checkpoint(model, directory)
