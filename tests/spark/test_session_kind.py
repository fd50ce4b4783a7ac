"""The classic side's located tasks (spark/session_kind.py) against the shared session."""

from __future__ import annotations

import pytest

from spark_receivers.spark.session_kind import ClassicSide


@pytest.mark.spark
def test_located_tasks_run_in_the_daemon_of_sqls_python_tasks(spark):
    # An executor starts a Python daemon for each environment its Python tasks ask for:
    # receivers, keeper tasks and probes must not cost a second one beside the batch reads.
    sc = spark.sparkContext
    before = dict(sc.environment)

    def located(items):
        import os

        for _ in items:
            pass
        yield os.getppid(), os.environ.get("SPARK_SIMPLIFIED_TRACEBACK")

    def sql(batches):
        import os

        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"daemon": os.getppid()}])

    rows, refused = ClassicSide(sc).run_located([("a", []), ("b", [])], located, strict=False)
    daemons = {
        r["daemon"] for r in spark.range(0, 2, 1, 2).mapInArrow(sql, "daemon long").collect()
    }
    assert refused == []
    assert {daemon for daemon, _ in rows} == daemons, (rows, daemons)
    assert [flag for _, flag in rows] == ["1", "1"]
    assert sc.environment == before  # the variable was there only while the function was made


@pytest.mark.spark
def test_the_environment_a_batch_may_be_reading_is_never_changed_under_it(spark):
    # A batch thread making its mapInArrow function iterates sc.environment (py4j converts
    # it key by key) while a receiver's launch may make its own function: the launch swaps
    # the dict, so the one a reader holds never changes size under it (a batch once failed
    # with "dictionary changed size during iteration").
    sc = spark.sparkContext
    held = sc.environment
    snapshot = dict(held)
    seen = {}

    class Rdd:
        @property
        def _jrdd(self):
            seen["held unchanged"] = held == snapshot
            seen["flag"] = sc.environment.get("SPARK_SIMPLIFIED_TRACEBACK")
            return None

    ClassicSide(sc)._with_sql_worker_env(Rdd())
    assert seen == {"held unchanged": True, "flag": "1"}
    assert sc.environment is held and held == snapshot
