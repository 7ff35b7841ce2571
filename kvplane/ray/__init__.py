"""The Ray side of the store: node shard actors, the shard directory, the location index, health."""
