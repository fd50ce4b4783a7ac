"""Executor side: everything that runs inside a receiver's Spark task."""
