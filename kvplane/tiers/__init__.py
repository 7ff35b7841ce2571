"""Tiers of the store: the interface, memory and fsspec tiers, their specs, latency and faults."""
