"""Benchmarks: they report numbers and never assert timings."""
