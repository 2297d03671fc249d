"""Benchmarks (imports nothing heavy: the CLI registers `bench` from here)."""
