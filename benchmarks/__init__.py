"""Benchmark scripts: speed and memory are measured here, never in timed tests."""
