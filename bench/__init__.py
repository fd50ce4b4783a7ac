"""Benchmarks: a TCP line load generator, peer pipelines and the rate-ladder harness.

Run ``python -m bench.run --quick`` from the repository root; see ``bench/run.py``.
"""
