"""Chunk KV: computed once, stored, looked up per request, with its variants and impact."""
