"""The worker daemon that imports our tasks' modules before it forks (spark/worker_daemon.py).

The tests' JVMs run it (tests/conftest.py sets ``spark.python.daemon.module``): here, that
the shared session's workers really are its children and start with the modules loaded,
and that the daemon hands over to PySpark's plain one when a fork would not be safe.
"""

from __future__ import annotations

import gc
import importlib.metadata
import os
import struct
import subprocess
import sys

import pytest

from spark_receivers.spark import worker_daemon

DAEMON = "spark_receivers.spark.worker_daemon"


def _start_daemon(**env: str) -> subprocess.Popen[bytes]:
    environ = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.Popen(
        [sys.executable, "-m", DAEMON, "pyspark.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**environ, **env},  # no new session: the daemon makes its own process group
    )


def _port_then_stop(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    """The port the daemon announces (as PySpark's daemon does), then stop it by its stdin."""
    try:
        raw = proc.stdout.read(4)  # type: ignore[union-attr]
        port = struct.unpack("!i", raw)[0] if len(raw) == 4 else -1
    finally:
        proc.stdin.close()  # type: ignore[union-attr]  # the daemon's signal to shut down
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()  # type: ignore[union-attr]
    return port, err.decode(errors="replace")


def test_with_one_blas_thread_the_daemon_preloads_and_serves():
    port, err = _port_then_stop(_start_daemon(OMP_NUM_THREADS="1"))
    assert 0 < port < 65536, err
    assert "running pyspark.daemon instead" not in err, err


def test_a_thread_a_fork_would_lose_hands_over_to_pysparks_plain_daemon():
    # numpy's OpenBLAS starts its pool at import when told to use more than one thread.
    port, err = _port_then_stop(_start_daemon(OMP_NUM_THREADS="4"))
    assert "the imports started threads a fork would lose" in err, err
    assert "running pyspark.daemon instead" in err, err
    assert 0 < port < 65536, err  # and the plain daemon still serves the executor


def _spark_home(root, *, version=None):
    """A pip-installed PySpark's layout under ``root``: the path Spark gives its workers.

    Its py4j zip has the installed py4j's version unless ``version`` says otherwise.
    """
    version = version or importlib.metadata.version("py4j")
    site = root / "site"
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "jars").mkdir()
    (site / "py4j").mkdir()
    for module in (site / "pyspark" / "__init__.py", site / "py4j" / "__init__.py"):
        module.write_text("")
    lib, jars = site / "pyspark" / "python" / "lib", site / "pyspark" / "jars"
    added = [
        lib / "pyspark.zip",
        lib / f"py4j-{version}-src.zip",
        jars / "spark-core_2.13-4.3.0.jar",
    ]
    for entry in added:
        entry.write_bytes(b"")
    return site / "pyspark", [str(p) for p in added], str(site)


def test_what_spark_adds_for_a_pip_installed_pyspark_is_taken_off_the_path(tmp_path):
    home, added, site = _spark_home(tmp_path)
    users = [str(tmp_path / "users.zip"), str(home / "jars" / "graphframes.jar")]
    path = [*added, *users, site]
    assert sorted(worker_daemon.redundant_spark_paths(path, str(home))) == sorted(added)


def test_a_py4j_zip_of_another_version_than_the_installed_one_stays(tmp_path):
    home, added, site = _spark_home(tmp_path, version="0.0.1")
    found = worker_daemon.redundant_spark_paths([*added, site], str(home))
    assert found == [added[0], added[2]]


def test_a_spark_distribution_beside_another_pyspark_keeps_its_zips(tmp_path):
    home, added, site = _spark_home(tmp_path)
    other = tmp_path / "dist"
    (other / "python" / "lib").mkdir(parents=True)
    spark_zip = other / "python" / "lib" / "pyspark.zip"
    spark_zip.write_bytes(b"")
    path = [str(spark_zip), site]
    assert worker_daemon.redundant_spark_paths(path, str(other)) == []
    assert worker_daemon.redundant_spark_paths(added, str(home)) == []  # no pyspark elsewhere
    assert worker_daemon.redundant_spark_paths([*added, site], None) == []


def test_a_failed_import_is_a_reason_to_hand_over():
    reason = worker_daemon.preload(("pyarrow", "no_such_module_of_ours"))
    assert reason is not None and "no_such_module_of_ours" in reason


@pytest.mark.spark
def test_the_sessions_workers_are_forked_by_it_with_the_modules_loaded(spark):
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == DAEMON

    def probe(batches):
        import os as os_
        import sys as sys_

        import pyarrow as pa

        with open(f"/proc/{os_.getppid()}/cmdline", "rb") as f:
            parent = f.read().replace(b"\0", b" ").decode()
        # What the daemon imported is in the worker before its task imports anything; the
        # task's own imports (this function's module, pyarrow) are in both cases.
        loaded = [m for m in worker_daemon.PRELOADED if m in sys_.modules]
        # ... and frozen out of the collector that PySpark runs after each task.
        walked = {id(o) for o in gc.get_objects()}
        frozen = [m for m in worker_daemon.PRELOADED if id(vars(sys_.modules[m])) not in walked]
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist(
            [{"parent": parent, "loaded": ",".join(loaded), "frozen": ",".join(frozen)}]
        )

    schema = "parent string, loaded string, frozen string"
    rows = spark.range(0, 2, 1, 2).mapInArrow(probe, schema).collect()
    assert len(rows) == 2
    for row in rows:
        assert DAEMON in row["parent"], row
        assert row["loaded"].split(",") == list(worker_daemon.PRELOADED), row
        assert row["frozen"] == row["loaded"], row


@pytest.mark.spark
def test_the_workers_import_the_installed_pyspark_not_the_zip_spark_adds(spark):
    import pyspark

    def probe(_):
        import sys as sys_

        import pyspark as pyspark_

        spark_home = os.path.dirname(pyspark_.__file__)
        return [(pyspark_.__file__, [p for p in sys_.path if p.startswith(spark_home)])]

    [(module, archives)] = spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()
    assert module == pyspark.__file__  # not .../pyspark/python/lib/pyspark.zip/...
    assert archives == []  # nor the py4j zip or spark-core jar beside it
