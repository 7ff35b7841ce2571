"""The chunk-KV store: keys, codec, tiers, tiered store, Ray shard actors, location index."""
