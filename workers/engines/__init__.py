"""The engine interface and the reference torch engine."""
