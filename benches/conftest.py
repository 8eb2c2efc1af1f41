"""Benchmarks run with `pytest benches/ --benchmark-only`; each records host baselines in extra_info."""
