"""The architecture facts of a supported checkpoint that the runner needs, validated once.

What sets one family apart from Llama (norm style, QK-norm, sandwich norms, activation, embedding scale, which
layers use a sliding window and which RoPE) is data here (`FamilyTraits`, `AttentionKind` per layer); the
runner, the loaders and the fusion read it and never branch on a family's name.
"""
import math
from dataclasses import dataclass, field
from typing import Any

from kvplane.checks import check

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"  # transformers' layer_types names
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


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
class AttentionKind:
    """How one layer attends: the rotation of its keys and how far back a query sees."""

    rope: RopeConfig
    window_tokens: int | None = None  # keys a query sees, itself included (None: every key before it)

    def __post_init__(self) -> None:
        window = self.window_tokens
        check(window is None or window >= 1, "window_tokens", "None or >= 1", window)

    @property
    def is_sliding(self) -> bool:
        """Whether queries of this layer see only the last `window_tokens` keys."""
        return self.window_tokens is not None


@dataclass(frozen=True, slots=True)
class FamilyTraits:
    """What sets an architecture apart from Llama's, as data the loader and the runner read.

    Norm names are the Hugging Face tensor names within a layer (also vLLM's module attribute names).
    """

    qkv_bias: bool = False
    activation: str = "silu"
    norm_weight_offset: float = 0.0  # RMSNorm scales by (offset + weight): Gemma stores weight - 1
    qk_norm: bool = False  # per-head RMSNorm of queries and keys before RoPE (self_attn.q_norm / k_norm)
    pre_mlp_norm: str = "post_attention_layernorm"
    attention_output_norm: str | None = None  # a norm on the attention output before the residual
    mlp_output_norm: str | None = None  # a norm on the MLP output before the residual
    scales_embeddings: bool = False  # embeddings times sqrt(hidden_size), rounded to the compute dtype
    attention_scalar_key: str | None = None  # config key whose value ** -0.5 scales attention logits
    has_layer_types: bool = False  # config.json's layer_types names each layer's attention (sliding or full)

    def __post_init__(self) -> None:
        check(self.activation in ACTIVATIONS, "activation", f"one of {ACTIVATIONS}", self.activation)


LLAMA_TRAITS = FamilyTraits()
GEMMA3_TRAITS = FamilyTraits(
    activation="gelu_pytorch_tanh",
    norm_weight_offset=1.0,
    qk_norm=True,
    pre_mlp_norm="pre_feedforward_layernorm",
    attention_output_norm="post_attention_layernorm",
    mlp_output_norm="post_feedforward_layernorm",
    scales_embeddings=True,
    attention_scalar_key="query_pre_attn_scalar",
    has_layer_types=True,
)
FAMILIES: dict[str, FamilyTraits] = {
    "LlamaForCausalLM": LLAMA_TRAITS,
    "MistralForCausalLM": LLAMA_TRAITS,
    "Qwen2ForCausalLM": FamilyTraits(qkv_bias=True),
    "Gemma3ForCausalLM": GEMMA3_TRAITS,
}
# config.json files without an "architectures" list name the family only by model_type.
MODEL_TYPE_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and options of a supported decoder-only transformer."""

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
    rope: RopeConfig  # the full-attention layers' (every layer's, unless layer_kinds says otherwise)
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    traits: FamilyTraits = LLAMA_TRAITS
    layer_kinds: tuple[AttentionKind, ...] = ()  # one per layer; () means every layer is full attention with `rope`
    attention_scale: float = field(default=0.0)  # logits times this; 0 means head_dim ** -0.5

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if min(self.num_layers, self.hidden_size, self.intermediate_size, self.vocab_size) <= 0:
            raise UnsupportedModelError("layer count and sizes must be positive")
        if not self.layer_kinds:
            object.__setattr__(self, "layer_kinds", (AttentionKind(self.rope),) * self.num_layers)
        if len(self.layer_kinds) != self.num_layers:
            raise UnsupportedModelError(f"{len(self.layer_kinds)} layer kinds for {self.num_layers} layers")
        if self.attention_scale == 0.0:
            object.__setattr__(self, "attention_scale", self.head_dim**-0.5)
        check(self.attention_scale > 0, "attention_scale", "> 0", self.attention_scale)

    @property
    def kv_shape_per_token(self) -> tuple[int, int]:
        """(num_kv_heads, head_dim): one token's K (or V) in one layer."""
        return self.num_kv_heads, self.head_dim

    @property
    def kv_values_per_token(self) -> int:
        """K and V values one token keeps over every layer (times the dtype's size: its cache bytes)."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim

    @property
    def embedding_scale(self) -> float:
        """What token embeddings are multiplied by before the first layer."""
        return math.sqrt(self.hidden_size) if self.traits.scales_embeddings else 1.0

    def layer_kind(self, layer: int) -> AttentionKind:
        """How layer `layer` attends (its RoPE and window)."""
        return self.layer_kinds[layer]

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face config.json dict; refuse what the runner cannot run exactly."""
        model_type = hf.get("model_type", "?")
        archs = hf.get("architectures") or [MODEL_TYPE_ARCHITECTURES.get(model_type, model_type)]
        arch = archs[0]
        if arch not in FAMILIES:
            raise UnsupportedModelError(f"architecture {arch!r} is not supported (supported: {', '.join(FAMILIES)})")
        traits = FAMILIES[arch]
        _refuse_unsupported_options(hf, traits)
        num_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        head_dim = int(hf.get("head_dim") or hidden // num_heads)
        num_layers = int(hf["num_hidden_layers"])
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        scalar = hf.get(traits.attention_scalar_key) if traits.attention_scalar_key else None
        return cls(
            architecture=arch,
            num_layers=num_layers,
            hidden_size=hidden,
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            intermediate_size=int(hf["intermediate_size"]),
            vocab_size=int(hf["vocab_size"]),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            rope=_rope_config(hf, FULL_ATTENTION),
            qkv_bias=traits.qkv_bias or bool(hf.get("attention_bias", False)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            traits=traits,
            layer_kinds=_layer_kinds(hf, traits, num_layers),
            attention_scale=float(scalar) ** -0.5 if scalar else head_dim**-0.5,
        )


def _refuse_unsupported_options(hf: dict[str, Any], traits: FamilyTraits) -> None:
    """Name each option that would make our forward pass differ from the reference."""
    act = hf.get("hidden_activation") or hf.get("hidden_act", traits.activation)
    if act != traits.activation:
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only {traits.activation!r})")
    if hf.get("mlp_bias"):
        raise UnsupportedModelError("mlp_bias=true is not supported")
    if not traits.has_layer_types and (
        hf.get("use_sliding_window") or (hf.get("model_type") == "mistral" and hf.get("sliding_window"))
    ):
        raise UnsupportedModelError("sliding-window attention is not supported")
    if hf.get("attention_bias") and not traits.qkv_bias:
        raise UnsupportedModelError(
            f"attention_bias=true on model_type {hf.get('model_type')!r} is not supported "
            "(it also biases o_proj, which the runner does not apply)"
        )
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if hf.get(key) is not None:
            raise UnsupportedModelError(f"{key}={hf[key]} is not supported (logit soft-capping)")
    if hf.get("use_bidirectional_attention"):
        raise UnsupportedModelError("use_bidirectional_attention=true is not supported (a causal decoder only)")


def _layer_kinds(hf: dict[str, Any], traits: FamilyTraits, num_layers: int) -> tuple[AttentionKind, ...]:
    """Each layer's RoPE and window from config.json's layer_types (every layer full attention without them)."""
    if not traits.has_layer_types:
        return ()
    types = hf.get("layer_types")
    if types is None:
        raise UnsupportedModelError("config.json has no layer_types (which layers use a sliding window)")
    if len(types) != num_layers or set(types) - {FULL_ATTENTION, SLIDING_ATTENTION}:
        raise UnsupportedModelError(f"layer_types must name {FULL_ATTENTION!r} or {SLIDING_ATTENTION!r} per layer")
    window = hf.get("sliding_window")
    if SLIDING_ATTENTION in types and not window:
        raise UnsupportedModelError("sliding_attention layers need a sliding_window")
    kinds = {
        FULL_ATTENTION: AttentionKind(_rope_config(hf, FULL_ATTENTION)),
        SLIDING_ATTENTION: AttentionKind(_rope_config(hf, SLIDING_ATTENTION), int(window) if window else None),
    }
    return tuple(kinds[t] for t in types)


def _rope_config(hf: dict[str, Any], layer_type: str) -> RopeConfig:
    """RoPE settings of one layer type, from the transformers 4 (rope_theta/rope_scaling, rope_local_base_freq)
    or 5 (rope_parameters, per layer type where layer types differ) form."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if layer_type in params:  # transformers 5: one entry per layer type
        params = dict(params[layer_type] or {})
    elif layer_type == SLIDING_ATTENTION and "rope_local_base_freq" in hf:  # transformers 4 Gemma 3
        params = {"rope_theta": hf["rope_local_base_freq"]}
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
