"""Model runner, RoPE, chunk-KV fusion (CacheBlend and baselines) and evaluation."""
