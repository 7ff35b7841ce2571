"""`blendserve bench serve`: the serving benchmark's workload, client, systems and metrics."""
