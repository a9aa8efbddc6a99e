"""Benchmark scripts and their helpers (run on a GPU machine; see bench/README.md)."""
