"""Layer-wise forward pass of a supported decoder model with explicit K/V in and out."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workers.model.checkpoint import Checkpoint
from workers.model.config import RopeConfig
from workers.model.kv_cache import KVCache
from workers.model.layers import causal_attention, gated_mlp, positional_attention, rms_norm
from workers.model.rope import apply_rope, cos_sin, inverse_frequencies, rerotate


@dataclass(frozen=True, slots=True)
class RotaryTables:
    """One RoPE's frequencies and its rotation tables for every position, on the runner's device."""

    inv_freq: torch.Tensor  # [D/2] float64
    cos: torch.Tensor  # [max_pos, D/2] float32: both halves of a rotate-half table repeat the same angles
    sin: torch.Tensor  # [max_pos, D/2]

    @classmethod
    def build(cls, rope: RopeConfig, head_dim: int, max_positions: int, device: torch.device) -> "RotaryTables":
        """Tables for positions 0..max_positions-1."""
        inv_freq = inverse_frequencies(rope, head_dim)
        cos, sin = cos_sin(inv_freq, torch.arange(max_positions))  # [max_pos, D] each
        half = head_dim // 2
        return cls(inv_freq, cos[:, :half].contiguous().to(device), sin[:, :half].contiguous().to(device))


class ModelRunner:
    """Runs any subset of tokens through one layer at a time; the fusion modes are built from these steps.

    Each layer attends as its config's AttentionKind says (its own RoPE, its own window), so a model whose
    layers differ (Gemma 3: sliding-window layers with one RoPE base, global layers with another) needs no
    special case here or in the fusion.
    """

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.weights = checkpoint.weights
        self.dtype = checkpoint.weights.embed.dtype
        self.device = checkpoint.weights.embed.device  # every tensor the fusion makes lives here
        cfg = self.config
        tables = {
            rope: RotaryTables.build(rope, cfg.head_dim, cfg.max_position_embeddings, self.device)
            for rope in dict.fromkeys(kind.rope for kind in cfg.layer_kinds)
        }  # built once per distinct RoPE
        self.rotary = [tables[kind.rope] for kind in cfg.layer_kinds]  # per layer
        self.inv_freq = inverse_frequencies(cfg.rope, cfg.head_dim)  # full-attention layers' (all layers' in Llama)
        self._embedding_scale = torch.tensor(cfg.embedding_scale, dtype=self.dtype, device=self.device)

    def new_cache(self, capacity: int) -> KVCache:
        """An empty KV buffer for one sequence, on the runner's device."""
        return KVCache(self.config, capacity, self.dtype, self.device)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings, times the family's scale rounded to the compute dtype. # [S] -> [S, hidden]"""
        x = self.weights.embed[token_ids]
        return x * self._embedding_scale if self.config.traits.scales_embeddings else x

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The family's RMSNorm over the last dimension. # [..., N] -> [..., N]"""
        return rms_norm(x, weight, self.config.rms_norm_eps, self.config.traits.norm_weight_offset)

    def qkv(self, layer: int, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Fresh Q, K, V of tokens with layer input h, (QK-normed and) RoPE applied at their positions.

        h: [S, hidden] -> q [S, H, D], k [S, H_kv, D], v [S, H_kv, D]
        """
        cfg, w = self.config, self.weights.layers[layer]
        x = self.norm(h, w.input_norm)
        qkv = F.linear(x, w.qkv, w.qkv_bias)
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q, k = q.reshape(-1, cfg.num_heads, cfg.head_dim), k.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        if w.q_norm is not None:
            q, k = self.norm(q, w.q_norm), self.norm(k, w.k_norm)
        rotary, index = self.rotary[layer], positions.to(self.device)
        cos, sin = rotary.cos[index], rotary.sin[index]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)

    def rerotate_keys(self, layer: int, k: torch.Tensor, delta_positions: int) -> torch.Tensor:
        """Cached keys of `layer` moved from positions p to p + delta with its RoPE (a KeyRotation). k: [T, H_kv, D]"""
        return rerotate(k, self.rotary[layer].inv_freq, delta_positions)

    def attend(self, layer: int, q: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Attention of q over the cache's keys at positions <= each query's (within the layer's window).

        Takes the fast causal path when the queries are exactly positions 0..S-1. q: [S, H, D] -> [S, H * D]
        """
        kind, scale = self.config.layer_kind(layer), self.config.attention_scale
        end = int(positions[-1]) + 1
        k, v = cache.layer(layer, end)
        if end == q.shape[0]:
            return causal_attention(q, k, v, scale, kind.window_tokens)
        return positional_attention(q, positions, k, v, scale, kind.window_tokens)

    def attend_and_mlp(
        self, layer: int, h: torch.Tensor, q: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Attention of q over the cache (keys at positions <= the query's), then the MLP; returns next h."""
        return self.after_attention(layer, h, self.attend(layer, q, positions, cache))

    def after_attention(self, layer: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The rest of a layer once its attention output is known: output projection, residual, MLP.

        h: [S, hidden] the layer's input; attn: [S, H * D] -> next h [S, hidden]
        """
        w = self.weights.layers[layer]
        out = F.linear(attn, w.o)
        if w.attention_output_norm is not None:
            out = self.norm(out, w.attention_output_norm)
        h = h + out
        out = gated_mlp(self.norm(h, w.post_norm), w.gate_up, w.down, self.config.traits.activation)
        if w.mlp_output_norm is not None:
            out = self.norm(out, w.mlp_output_norm)
        return h + out

    def layer(self, layer: int, h: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One full layer for the given tokens: write their fresh K/V into the cache, then attend."""
        q, k, v = self.qkv(layer, h, positions)
        cache.write(layer, positions, k, v)
        return self.attend_and_mlp(layer, h, q, positions, cache)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head, in float32. # [S, hidden] -> [S, V]"""
        return F.linear(self.norm(h, self.weights.final_norm), self.weights.lm_head).float()

    def forward(self, token_ids: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        """Prefill or decode tokens at positions start.. on top of the cache's first `start` slots.

        Returns the final hidden states. # [S] -> [S, hidden]
        """
        positions = torch.arange(start, start + token_ids.shape[0])
        if positions[-1] >= cache.capacity:
            raise ValueError(f"sequence of {int(positions[-1]) + 1} tokens exceeds the cache capacity {cache.capacity}")
        h = self.embed(token_ids)
        for i in range(self.config.num_layers):
            h = self.layer(i, h, positions, cache)
        cache.length = max(cache.length, int(positions[-1]) + 1)
        return h
