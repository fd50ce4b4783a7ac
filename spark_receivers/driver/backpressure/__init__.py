"""Backpressure: rate controllers and their estimators."""
