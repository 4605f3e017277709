"""Models used by the examples, tests and benchmarks."""
