"""The architecture facts of a Llama-family checkpoint that the runner needs, validated once."""
from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": False, "MistralForCausalLM": False, "Qwen2ForCausalLM": True}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# config.json files without an "architectures" list name the family only by model_type.
MODEL_TYPE_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


class UnsupportedModelError(ValueError):
    """The checkpoint uses a feature the layer-wise runner does not implement."""


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding settings; every supported type rotates by an angle linear in position."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope type {self.rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)}); "
                "its rotation is not a fixed angle per position, so cached keys cannot be re-rotated exactly"
            )
        if self.theta <= 0 or self.factor <= 0:
            raise UnsupportedModelError(f"rope theta and factor must be positive, got {self.theta}, {self.factor}")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and options of a decoder-only Llama-family transformer."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if min(self.num_layers, self.hidden_size, self.intermediate_size, self.vocab_size) <= 0:
            raise UnsupportedModelError("layer count and sizes must be positive")

    @property
    def kv_shape_per_token(self) -> tuple[int, int]:
        """(num_kv_heads, head_dim): one token's K (or V) in one layer."""
        return self.num_kv_heads, self.head_dim

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face config.json dict; refuse what the runner cannot run exactly."""
        model_type = hf.get("model_type", "?")
        archs = hf.get("architectures") or [MODEL_TYPE_ARCHITECTURES.get(model_type, model_type)]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        _refuse_unsupported_options(hf)
        num_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            architecture=arch,
            num_layers=int(hf["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(hf.get("head_dim") or hidden // num_heads),
            intermediate_size=int(hf["intermediate_size"]),
            vocab_size=int(hf["vocab_size"]),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            rope=_rope_config(hf),
            qkv_bias=SUPPORTED_ARCHITECTURES[arch] or bool(hf.get("attention_bias", False)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _refuse_unsupported_options(hf: dict[str, Any]) -> None:
    """Name each option that would make our forward pass differ from the reference."""
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only 'silu')")
    if hf.get("mlp_bias"):
        raise UnsupportedModelError("mlp_bias=true is not supported")
    if hf.get("use_sliding_window") or (hf.get("model_type") == "mistral" and hf.get("sliding_window")):
        raise UnsupportedModelError("sliding-window attention is not supported")
    if hf.get("attention_bias") and hf.get("model_type") != "qwen2":
        raise UnsupportedModelError(
            f"attention_bias=true on model_type {hf.get('model_type')!r} is not supported "
            "(it also biases o_proj, which the runner does not apply)"
        )


def _rope_config(hf: dict[str, Any]) -> RopeConfig:
    """Read RoPE settings from either the transformers 4 (rope_theta/rope_scaling) or 5 (rope_parameters) form."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )
