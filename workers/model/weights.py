"""Model weights regrouped for the layer-wise runner (fused QKV and gate/up projections)."""
from dataclasses import dataclass

import torch

from workers.model.config import ModelConfig, UnsupportedModelError


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer's tensors, laid out for single matmuls; a family's optional norms are None when absent."""

    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(H + 2 H_kv) D, hidden]
    qkv_bias: torch.Tensor | None  # [(H + 2 H_kv) D]
    o: torch.Tensor  # [hidden, H D]
    post_norm: torch.Tensor  # [hidden] the norm before the MLP
    gate_up: torch.Tensor  # [2 I, hidden]
    down: torch.Tensor  # [hidden, I]
    q_norm: torch.Tensor | None = None  # [D] per-head query norm (QK-norm)
    k_norm: torch.Tensor | None = None  # [D] per-head key norm
    attention_output_norm: torch.Tensor | None = None  # [hidden] on the attention output, before the residual
    mlp_output_norm: torch.Tensor | None = None  # [hidden] on the MLP output, before the residual


@dataclass(slots=True)
class ModelWeights:
    """All tensors of the model in the compute dtype."""

    embed: torch.Tensor  # [V, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [V, hidden]

    @classmethod
    def from_state_dict(
        cls, config: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> "ModelWeights":
        """Regroup Hugging Face tensor names (the family's, from its traits) on `device`; name a missing tensor."""
        traits = config.traits

        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise UnsupportedModelError(f"checkpoint has no tensor {name!r}")
            return state[name].to(device=device, dtype=dtype)

        def optional(prefix: str, name: str | None) -> torch.Tensor | None:
            return take(f"{prefix}{name}.weight") if name is not None else None

        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            attn = [take(f"{p}self_attn.{n}_proj.weight") for n in ("q", "k", "v")]
            bias = [take(f"{p}self_attn.{n}_proj.bias") for n in ("q", "k", "v")] if config.qkv_bias else None
            layers.append(
                LayerWeights(
                    input_norm=take(f"{p}input_layernorm.weight"),
                    qkv=torch.cat(attn).contiguous(),
                    qkv_bias=torch.cat(bias).contiguous() if bias else None,
                    o=take(f"{p}self_attn.o_proj.weight"),
                    post_norm=take(f"{p}{traits.pre_mlp_norm}.weight"),
                    gate_up=torch.cat([take(f"{p}mlp.gate_proj.weight"), take(f"{p}mlp.up_proj.weight")]).contiguous(),
                    down=take(f"{p}mlp.down_proj.weight"),
                    q_norm=optional(p, "self_attn.q_norm" if traits.qk_norm else None),
                    k_norm=optional(p, "self_attn.k_norm" if traits.qk_norm else None),
                    attention_output_norm=optional(p, traits.attention_output_norm),
                    mlp_output_norm=optional(p, traits.mlp_output_norm),
                )
            )
        embed = take("model.embed_tokens.weight")
        head = embed if config.tie_word_embeddings else take("lm_head.weight")
        return cls(embed=embed, layers=layers, final_norm=take("model.norm.weight"), lm_head=head)
