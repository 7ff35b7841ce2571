"""Layer-wise forward pass of a Llama-family model with explicit K/V in and out."""
import torch
import torch.nn.functional as F

from workers.checkpoint import Checkpoint
from workers.kv_cache import KVCache
from workers.layers import causal_attention, gated_mlp, positional_attention, rms_norm
from workers.rope import apply_rope, cos_sin, inverse_frequencies, rerotate


class ModelRunner:
    """Runs any subset of tokens through one layer at a time; the fusion modes are built from these steps."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.weights = checkpoint.weights
        self.dtype = checkpoint.weights.embed.dtype
        self.device = checkpoint.weights.embed.device  # every tensor the fusion makes lives here
        self.inv_freq = inverse_frequencies(self.config.rope, self.config.head_dim)
        all_positions = torch.arange(self.config.max_position_embeddings)
        cos, sin = cos_sin(self.inv_freq, all_positions)  # [max_pos, D] each, built once
        self.cos, self.sin = cos.to(self.device), sin.to(self.device)

    def new_cache(self, capacity: int) -> KVCache:
        """An empty KV buffer for one sequence, on the runner's device."""
        return KVCache(self.config, capacity, self.dtype, self.device)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings. # [S] -> [S, hidden]"""
        return self.weights.embed[token_ids]

    def qkv(self, layer: int, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Fresh Q, K, V of tokens with layer input h, RoPE applied at their positions.

        h: [S, hidden] -> q [S, H, D], k [S, H_kv, D], v [S, H_kv, D]
        """
        cfg, w = self.config, self.weights.layers[layer]
        x = rms_norm(h, w.input_norm, cfg.rms_norm_eps)
        qkv = F.linear(x, w.qkv, w.qkv_bias)
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        cos, sin = self.cos[positions.to(self.device)], self.sin[positions.to(self.device)]
        q = apply_rope(q.reshape(-1, cfg.num_heads, cfg.head_dim), cos, sin)
        k = apply_rope(k.reshape(-1, cfg.num_kv_heads, cfg.head_dim), cos, sin)
        return q, k, v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)

    def rerotate_keys(self, k: torch.Tensor, delta_positions: int) -> torch.Tensor:
        """Cached keys moved from positions p to p + delta (a KeyRotation). k: [T, H_kv, D]"""
        return rerotate(k, self.inv_freq, delta_positions)

    def attend_and_mlp(
        self, layer: int, h: torch.Tensor, q: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Attention of q over the cache (keys at positions <= the query's), then the MLP; returns next h.

        Takes the fast causal path when the queries are exactly positions 0..S-1.
        """
        end = int(positions[-1]) + 1
        k, v = cache.layer(layer, end)
        if end == q.shape[0]:
            attn = causal_attention(q, k, v)
        else:
            attn = positional_attention(q, positions, k, v)
        return self.after_attention(layer, h, attn)

    def after_attention(self, layer: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The rest of a layer once its attention output is known: output projection, residual, MLP.

        h: [S, hidden] the layer's input; attn: [S, H * D] -> next h [S, hidden]
        """
        cfg, w = self.config, self.weights.layers[layer]
        h = h + F.linear(attn, w.o)
        return h + gated_mlp(rms_norm(h, w.post_norm, cfg.rms_norm_eps), w.gate_up, w.down)

    def layer(self, layer: int, h: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One full layer for the given tokens: write their fresh K/V into the cache, then attend."""
        q, k, v = self.qkv(layer, h, positions)
        cache.write(layer, positions, k, v)
        return self.attend_and_mlp(layer, h, q, positions, cache)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head, in float32. # [S, hidden] -> [S, V]"""
        x = rms_norm(h, self.weights.final_norm, self.config.rms_norm_eps)
        return F.linear(x, self.weights.lm_head).float()

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
