"""Data sources, vocabularies, batching and metrics for normlab (one module per job)."""
