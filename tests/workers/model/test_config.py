"""config.json of supported checkpoints parses (Gemma 3's layer kinds too); features the runner cannot run exactly
are refused by name."""
from typing import Any

import pytest

from workers.model.config import GEMMA3_TRAITS, AttentionKind, ModelConfig, RopeConfig, UnsupportedModelError


def llama_config(**overrides: Any) -> dict[str, Any]:
    """A Llama config.json dict as transformers 5 writes it (GQA 8:2, explicit head_dim)."""
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 512,
        "intermediate_size": 1376,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "num_attention_heads": 8,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "vocab_size": 32000,
    }
    config.update(overrides)
    return config


def mistral_config(**overrides: Any) -> dict[str, Any]:
    """A Mistral config.json dict with sliding window off, in the transformers 4 form (top-level rope_theta)."""
    config = llama_config(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None)
    for key in ("attention_bias", "mlp_bias", "rope_parameters"):
        del config[key]
    config["rope_theta"] = 1000000.0
    config.update(overrides)
    return config


def qwen2_config(**overrides: Any) -> dict[str, Any]:
    """A Qwen2 config.json dict: no head_dim key, sliding window configured but not used."""
    config = llama_config(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        num_attention_heads=14,
        hidden_size=896,
        use_sliding_window=False,
        sliding_window=32768,
        max_window_layers=21,
        tie_word_embeddings=True,
        eos_token_id=[151645, 151643],
        bos_token_id=None,
    )
    for key in ("attention_bias", "mlp_bias", "head_dim"):
        del config[key]
    config.update(overrides)
    return config


def gemma3_config(**overrides: Any) -> dict[str, Any]:
    """Gemma 3 270M's config.json as transformers 5 writes it: 5 sliding-window layers to 1 global, two RoPE bases."""
    config: dict[str, Any] = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "attention_bias": False,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 640,
        "intermediate_size": 2048,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
        "max_position_embeddings": 32768,
        "num_attention_heads": 4,
        "num_hidden_layers": 18,
        "num_key_value_heads": 1,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 512,
        "tie_word_embeddings": True,
        "use_bidirectional_attention": False,
        "vocab_size": 262144,
    }
    config.update(overrides)
    return config


def without(config: dict[str, Any], *keys: str) -> dict[str, Any]:
    """A copy of config with keys removed."""
    return {k: v for k, v in config.items() if k not in keys}


def test_llama_parses() -> None:
    cfg = ModelConfig.from_hf(llama_config())
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (4, 512, 1376, 32000)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (8, 2, 64)
    assert cfg.kv_shape_per_token == (2, 64)
    assert cfg.rope == RopeConfig(theta=500000.0)
    assert cfg.qkv_bias is False
    assert cfg.tie_word_embeddings is False
    assert cfg.rms_norm_eps == 1e-5
    assert cfg.max_position_embeddings == 4096
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (1, (2,))


def test_mistral_parses() -> None:
    cfg = ModelConfig.from_hf(mistral_config())
    assert cfg.architecture == "MistralForCausalLM"
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (8, 2, 64)
    assert cfg.rope.theta == 1000000.0
    assert cfg.qkv_bias is False


def test_qwen2_parses_with_qkv_bias() -> None:
    cfg = ModelConfig.from_hf(qwen2_config())
    assert cfg.architecture == "Qwen2ForCausalLM"
    assert cfg.qkv_bias is True
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (14, 2, 64)
    assert cfg.tie_word_embeddings is True
    assert cfg.eos_token_ids == (151645, 151643)
    assert cfg.bos_token_id is None


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    cfg = ModelConfig.from_hf(without(llama_config(hidden_size=768, num_attention_heads=12), "head_dim"))
    assert cfg.head_dim == 64
    assert ModelConfig.from_hf(llama_config(head_dim=None, hidden_size=256)).head_dim == 32


def test_explicit_head_dim_wins_over_hidden_over_heads() -> None:
    assert ModelConfig.from_hf(llama_config(head_dim=128)).head_dim == 128


def test_kv_heads_default_to_heads() -> None:
    cfg = ModelConfig.from_hf(without(llama_config(), "num_key_value_heads"))
    assert cfg.num_kv_heads == cfg.num_heads == 8


def test_missing_architectures_falls_back_to_model_type() -> None:
    assert ModelConfig.from_hf(without(llama_config(), "architectures")).architecture == "LlamaForCausalLM"
    assert ModelConfig.from_hf(qwen2_config(architectures=None)).qkv_bias is True


@pytest.mark.parametrize(
    "rope_keys",
    [
        {"rope_theta": 250000.0},
        {"rope_theta": 250000.0, "rope_scaling": None},
        {"rope_parameters": {"rope_theta": 250000.0, "rope_type": "default"}},
    ],
    ids=["transformers4", "transformers4-null-scaling", "transformers5"],
)
def test_rope_theta_read_from_either_form(rope_keys: dict[str, Any]) -> None:
    cfg = ModelConfig.from_hf({**without(llama_config(), "rope_parameters"), **rope_keys})
    assert cfg.rope == RopeConfig(theta=250000.0, rope_type="default")


def test_rope_theta_defaults_to_ten_thousand() -> None:
    assert ModelConfig.from_hf(without(llama_config(), "rope_parameters")).rope.theta == 10000.0


LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    "rope_keys",
    [
        {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3_SCALING}},
        {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", **LLAMA3_SCALING}},
    ],
    ids=["transformers4", "transformers5"],
)
def test_llama3_scaling_read(rope_keys: dict[str, Any]) -> None:
    cfg = ModelConfig.from_hf({**without(llama_config(), "rope_parameters"), **rope_keys})
    assert cfg.rope == RopeConfig(
        theta=500000.0,
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )


@pytest.mark.parametrize(
    "rope_keys",
    [
        {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}},
        {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
        {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0}},
    ],
    ids=["transformers4-type", "transformers4-rope_type", "transformers5"],
)
def test_linear_scaling_read(rope_keys: dict[str, Any]) -> None:
    cfg = ModelConfig.from_hf({**without(llama_config(), "rope_parameters"), **rope_keys})
    assert (cfg.rope.rope_type, cfg.rope.factor, cfg.rope.theta) == ("linear", 4.0, 10000.0)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (llama_config(architectures=["GPT2LMHeadModel"], model_type="gpt2"), "'GPT2LMHeadModel' is not supported"),
        (qwen2_config(architectures=["Qwen3ForCausalLM"], model_type="qwen3"), "'Qwen3ForCausalLM' is not supported"),
        (without(llama_config(model_type="gpt2"), "architectures"), "'gpt2' is not supported"),
        (
            llama_config(rope_parameters={"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}),
            "rope type 'yarn' is not supported",
        ),
        (
            {**without(llama_config(), "rope_parameters"), "rope_scaling": {"type": "dynamic", "factor": 2.0}},
            "rope type 'dynamic' is not supported",
        ),
        (llama_config(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        (mistral_config(sliding_window=4096), "sliding-window attention is not supported"),
        (qwen2_config(use_sliding_window=True), "sliding-window attention is not supported"),
        (llama_config(mlp_bias=True), "mlp_bias=true is not supported"),
        (llama_config(attention_bias=True), "attention_bias=true on model_type 'llama' is not supported"),
        (mistral_config(attention_bias=True), "attention_bias=true on model_type 'mistral' is not supported"),
        (llama_config(num_key_value_heads=3), "num_heads 8 is not a multiple of num_kv_heads 3"),
        (llama_config(head_dim=63), "head_dim 63 must be even"),
        (llama_config(rope_parameters={"rope_theta": 0.0, "rope_type": "default"}), "must be positive"),
    ],
    ids=[
        "gpt2",
        "qwen3",
        "gpt2-by-model-type",
        "yarn",
        "dynamic",
        "gelu",
        "mistral-sliding-window",
        "qwen2-sliding-window",
        "mlp-bias",
        "llama-attention-bias",
        "mistral-attention-bias",
        "kv-heads",
        "odd-head-dim",
        "zero-theta",
    ],
)
def test_unsupported_config_is_refused_by_name(config: dict[str, Any], problem: str) -> None:
    with pytest.raises(UnsupportedModelError) as refused:
        ModelConfig.from_hf(config)
    assert problem in str(refused.value)


def test_gemma3_parses_with_its_layer_kinds() -> None:
    cfg = ModelConfig.from_hf(gemma3_config())
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.traits == GEMMA3_TRAITS
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (18, 4, 1, 256)
    local, global_ = AttentionKind(RopeConfig(theta=10000.0), 512), AttentionKind(RopeConfig(theta=1000000.0))
    assert cfg.layer_kinds == ((local,) * 5 + (global_,)) * 3
    assert cfg.layer_kind(5) == cfg.layer_kind(17) == global_ and cfg.layer_kind(0).is_sliding
    assert cfg.rope == RopeConfig(theta=1000000.0)  # the full-attention layers'
    assert cfg.attention_scale == 256**-0.5 and cfg.embedding_scale == 640**0.5
    assert cfg.qkv_bias is False and cfg.tie_word_embeddings is True


def test_gemma3_attention_scale_follows_query_pre_attn_scalar() -> None:
    assert ModelConfig.from_hf(gemma3_config(query_pre_attn_scalar=144)).attention_scale == 144**-0.5
    llama = ModelConfig.from_hf(llama_config())
    assert llama.attention_scale == 64**-0.5 and llama.embedding_scale == 1.0
    assert all(kind == AttentionKind(llama.rope) for kind in llama.layer_kinds)


def test_gemma3_transformers4_form_reads_the_local_base() -> None:
    """transformers 4 wrote rope_theta (global), rope_local_base_freq and rope_scaling (global layers only)."""
    hf = without(gemma3_config(), "rope_parameters")
    hf.update(rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0})
    cfg = ModelConfig.from_hf(hf)
    assert cfg.layer_kind(0).rope == RopeConfig(theta=10000.0)
    assert cfg.layer_kind(5).rope == RopeConfig(theta=1000000.0, rope_type="linear", factor=8.0)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (gemma3_config(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0 is not supported"),
        (gemma3_config(final_logit_softcapping=30.0), "final_logit_softcapping=30.0 is not supported"),
        (gemma3_config(use_bidirectional_attention=True), "use_bidirectional_attention"),
        (gemma3_config(hidden_activation="silu"), "hidden_act 'silu' is not supported"),
        (without(gemma3_config(), "layer_types"), "no layer_types"),
        (gemma3_config(layer_types=["full_attention"] * 17), "layer_types must name"),
        (gemma3_config(layer_types=["chunked_attention"] * 18), "layer_types must name"),
        (gemma3_config(sliding_window=None), "need a sliding_window"),
        (gemma3_config(architectures=["Gemma3ForConditionalGeneration"]), "is not supported"),
    ],
    ids=["attn-softcap", "final-softcap", "bidirectional", "silu", "no-layer-types", "layer-count", "unknown-kind",
         "no-window", "multimodal"],
)
def test_unsupported_gemma3_config_is_refused_by_name(config: dict[str, Any], problem: str) -> None:
    with pytest.raises(UnsupportedModelError) as refused:
        ModelConfig.from_hf(config)
    assert problem in str(refused.value)


def test_refusal_lists_what_is_supported() -> None:
    supported = "supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"
    with pytest.raises(UnsupportedModelError, match=supported):
        ModelConfig.from_hf(llama_config(architectures=["GPT2LMHeadModel"]))
    with pytest.raises(UnsupportedModelError, match="supported: default, linear, llama3"):
        ModelConfig.from_hf(llama_config(rope_parameters={"rope_theta": 1e4, "rope_type": "yarn"}))
