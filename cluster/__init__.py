"""Cluster wiring: configuration, HTTP API, Ray Serve application and the command line."""
