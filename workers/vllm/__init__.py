"""vLLM integration: a KV connector that feeds blendserve's fused context KV into vLLM's paged KV cache."""
