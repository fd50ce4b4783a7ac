"""Shared fixtures: one local Spark session for the whole test run."""

from __future__ import annotations

import os
import sys

import pytest

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    """A local[4] SparkSession shared by every test that needs Spark."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[4]")
        .appName("spark-receivers-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def pytest_collection_modifyitems(config, items):
    """Group the tests for ``make test``'s two workers (``-n 2 --dist loadgroup``).

    A file's tests stay on one worker (its module fixtures start once), and every test
    that needs the standalone cluster goes to the same worker, so the session starts one
    Master + 2 Workers, never two side by side on a 2-core machine. Without xdist the
    markers do nothing.
    """
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        fixtures = getattr(item, "fixturenames", ())
        group = "standalone-cluster" if "standalone" in fixtures else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(name=group))
