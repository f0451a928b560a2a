"""Benchmarks: each prints a table and writes reports/bench-<name>.json."""
