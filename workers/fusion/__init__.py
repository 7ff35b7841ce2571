"""Chunk-KV fusion: CacheBlend, Cache-Craft and the baselines, as strategies over one selective pass."""
