"""Eviction and admission policies of a tier: LRU, W-TinyLFU, impact-aware LFU, shares."""
