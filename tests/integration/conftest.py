"""Session fixtures of the integration tests: one standalone cluster for the tests that need it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from standalone import StandaloneCluster


@pytest.fixture(scope="session")
def standalone(tmp_path_factory) -> Iterator[StandaloneCluster]:
    """A Spark standalone Master + 2 Workers (2 cores each), started once, stopped by PID."""
    root = tmp_path_factory.mktemp("standalone")
    cluster = StandaloneCluster(root).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root / "work-0", ignore_errors=True)
        shutil.rmtree(root / "work-1", ignore_errors=True)
