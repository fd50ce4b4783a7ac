"""Fixtures for the write-ahead log tests."""

from __future__ import annotations

from wal_helpers import kind, log_dir

__all__ = ["kind", "log_dir"]
