"""Corpus ingest: a document collection's chunk KV computed across the cluster with Ray Data, ids kept in a table."""
