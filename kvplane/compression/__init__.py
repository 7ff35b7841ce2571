"""Lossy compressions of stored chunk KV, one per layer, named in a blob's header (never in its key)."""
