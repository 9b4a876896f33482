"""Slow, obviously-correct reference implementations used by the tests and benchmarks."""
