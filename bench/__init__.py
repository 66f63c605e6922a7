"""Benchmarks: each figure beside a baseline measured in the same run (bench/README.md)."""
