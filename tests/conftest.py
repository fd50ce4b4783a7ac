"""Shared fixtures: one local Spark session for the whole test run."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings
from jvm_archive import JVM_FLAGS, ArchiveBuild, begin, options

# Property tests are checks of logic, not of speed: Hypothesis's default 200 ms deadline per
# example failed tests/receiver/test_lines.py once on a loaded 2-core machine (2026-11-28),
# and its random examples (and the failures it replays from .hypothesis/) made one run
# differ from the next. The same examples every run, and no clock.
settings.register_profile("suite", deadline=None, derandomize=True, database=None)
settings.load_profile("suite")

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Every JVM the tests start (the session's, the CLI runs', spark-submit's, the standalone
# Master/Worker and their executors, the Connect server) inherits this. A test's JVM lives
# seconds to minutes, and half of its CPU went to the C2 compiler and G1's threads: a local
# session running 20 small jobs and a parquet write took 36.8 s of JVM CPU by default and
# 16.9-18.5 s with these two flags (2026-11-27, /proc/PID/stat). On 2 cores that CPU is the
# suite's wall time. The JVM names the variable on stderr at start ("Picked up ..."); no
# test reads that line. Benchmarks (make bench) never load this file, so keep their JIT.
#
# The same variable carries one Spark setting to every one of those JVMs (SparkConf reads
# the JVM's spark.* system properties): Python workers are forked by our worker daemon,
# which imports pyarrow, Flight and our task modules once (spark/worker_daemon.py). Each
# forked worker imported them itself, ~1.5 s of CPU, and the suite forks ~500 (a quarter
# of its CPU); the daemons, one per executor and kind of task, pay ~1 s more each, so the
# saving is a few percent (docs/decisions/0020).
#
# And one more: no warm-up of the batch path (spark.receivers.warmUp.timeout=0). Every
# context the tests start paid it before its receivers: a Spark job through the batch path,
# to make a user's first batches fast. No test's verdict is the first batches' speed, and
# it cost a context 6.6 s and 8 of its 21 CPU-seconds (an `ingest` run whose source cannot
# be reached, 2026-11-29: 21.7 s wall, 20.9 CPU-s with it; 15.2 s, 12.7 CPU-s without). The
# warm-up's own tests call it, or give the key in the config, which wins over this.
_OWN_JVM_OPTIONS = "JAVA_TOOL_OPTIONS" not in os.environ
WORKER_DAEMON = "-Dspark.python.daemon.module=spark_receivers.spark.worker_daemon"
NO_WARM_UP = "-Dspark.receivers.warmUp.timeout=0"
TEST_JVM_OPTIONS = f"{JVM_FLAGS} {WORKER_DAEMON} {NO_WARM_UP}"
os.environ.setdefault("JAVA_TOOL_OPTIONS", TEST_JVM_OPTIONS)  # + the class archive


_ARCHIVE: ArchiveBuild | None = None


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def pytest_configure(config):
    """Add the class-data-sharing archive of Spark's classes to the tests' JVM options.

    Built once per venv (tests/jvm_archive.py) by the process that starts xdist's workers
    (they inherit the variable), beside the first tests: those are the files of
    :data:`EARLY_FILES`, which start no JVM. A JVM that cannot use it (another class path,
    or started before the build ends) runs as without it.
    """
    global _ARCHIVE
    if hasattr(config, "workerinput"):
        return  # an xdist worker: its controller did it
    # The suite's time depends on the host as much as on the commit: hosts of one kind ran it
    # in 10 min and in 23 (2026-11-29). The log names which one this was (0.3 CPU-s).
    if str(config.rootpath) not in sys.path:
        sys.path.insert(0, str(config.rootpath))
    from bench.machine import core_speed

    _say(f"host: one core runs {core_speed()} M steps/s of bench.machine.core_speed's loop")
    if not _OWN_JVM_OPTIONS:
        return  # the caller's own JVM options
    _ARCHIVE = begin(JVM_FLAGS, say=_say)
    if _ARCHIVE is not None:
        os.environ["JAVA_TOOL_OPTIONS"] = f"{TEST_JVM_OPTIONS} {options(_ARCHIVE.path)}"


def pytest_unconfigure(config):
    """The archive's build ends with the run that started it (it waits for a short run)."""
    if _ARCHIVE is not None:
        _ARCHIVE.finish(say=_say)


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


# The files whose tests use the standalone cluster (tests/integration/conftest.py): make
# test's workers run them as one unit, so one Master + 2 Workers run at a time.
STANDALONE_FILES = (
    "tests/integration/test_standalone.py",
    "tests/integration/test_replication.py",
    "tests/integration/test_connect_standalone.py",
)
CLUSTER_UNIT = "standalone-cluster"
"""The name of the one xdist unit that :data:`STANDALONE_FILES` make together."""


# The order in which make test's workers start the files, after EARLY_FILES: the long ones,
# longest first (worker seconds per file in the fresh-clone run of 2026-11-28 18:09 UTC,
# dc99227, junit times), so that the last file a worker starts is a short one and neither
# worker is left alone at the end (the same run's last 5 minutes were 60 % busy, the
# 126 s of test_docs.py last). The files not named here follow, integration files first.
# SLOW: the files of long scenarios (a Spark, a cluster or a CLI process of their own, kills
# and restarts: minutes per test), marked ``slow`` so that ``make test-fast`` (-m 'not
# slow') leaves them out; ``make test`` and CI run them all.
SLOW, NOT_SLOW = True, False
LONGEST_FIRST = (
    (CLUSTER_UNIT, SLOW),  # STANDALONE_FILES: 392 + 143 + 130 s
    ("tests/integration/test_chaos.py", SLOW),  # 270 s (before its driver kill left, 2026-11-29)
    ("tests/test_ingest.py", SLOW),  # 212 s
    ("tests/integration/test_exactly_once.py", SLOW),  # 211 s
    ("tests/integration/test_structured_source.py", SLOW),  # 202 s
    ("tests/integration/test_broker_ingest_crash.py", SLOW),  # 178 s
    ("tests/test_docs.py", NOT_SLOW),  # 126 s
    ("tests/integration/test_ingest_crash.py", SLOW),  # 125 s
    ("tests/integration/test_connect.py", SLOW),  # 112 s
    ("tests/integration/test_mqtt_delivery.py", SLOW),  # 111 s
    ("tests/integration/test_driver_crash.py", SLOW),  # 110 s
    ("tests/integration/test_builtin_receivers.py", NOT_SLOW),  # 110 s
    ("tests/integration/test_streaming_lifecycle.py", NOT_SLOW),  # 90 s
    ("tests/integration/test_cluster.py", SLOW),  # 79 s
    ("tests/integration/test_state_by_key.py", SLOW),  # 72 s
    ("tests/integration/test_receiver_kills.py", NOT_SLOW),  # 72 s
    ("tests/integration/test_large_records.py", SLOW),  # 69 s
    ("tests/integration/test_observability.py", NOT_SLOW),  # 68 s
    ("tests/integration/test_ingest_findings.py", NOT_SLOW),  # 55 s
    ("tests/bench/test_smoke.py", NOT_SLOW),  # 46 s (bench_smoke: out of test-fast anyway)
    ("tests/integration/test_windows.py", SLOW),  # 32 s
)
_UNITS = [unit for unit, _ in LONGEST_FIRST]
SLOW_FILES = frozenset(
    [*STANDALONE_FILES, *(unit for unit, slow in LONGEST_FIRST if slow and unit != CLUSTER_UNIT)]
)

# Started first, beside the build of the JVM class archive (tests/jvm_archive.py, ~70 s of
# one core on a slow host the first time in a venv): unit tests of the receivers, the
# brokers' clients, the WALs and the RPC layer, ~145 s of worker time (dc99227), no JVM.
EARLY_FILES = ("tests/receivers/", "tests/wal/", "tests/rpc/", "tests/util/", "tests/stream/")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Order for ``make test``'s two workers: the JVM-free files, the long units, the rest.

    :data:`EARLY_FILES` first (they run while the class archive is built), then the long
    files longest first (:data:`LONGEST_FIRST`, the standalone cluster's unit leads), then
    the other integration files, then the unit tests: the worker that gets the last unit
    then has little left to do alone.
    Every test that uses the ``standalone`` fixture must be in :data:`STANDALONE_FILES`.
    """
    strays = sorted(
        {
            _file_of(item.nodeid)
            for item in items
            if "standalone" in getattr(item, "fixturenames", ())
            and _file_of(item.nodeid) not in STANDALONE_FILES
        }
    )
    if strays:
        raise pytest.UsageError(
            f"{strays} use the standalone cluster: add them to STANDALONE_FILES in "
            "tests/conftest.py, so that xdist runs every cluster test on one worker"
        )

    missing = [f for f in _UNITS[1:] if not (config.rootpath / f).is_file()]
    if missing:
        raise pytest.UsageError(f"{missing} in LONGEST_FIRST (tests/conftest.py) do not exist")

    def rank(item) -> int:
        path = _file_of(item.nodeid)
        unit = CLUSTER_UNIT if path in STANDALONE_FILES else path
        if path.startswith(EARLY_FILES):
            return 0
        if unit in _UNITS:
            return 1 + _UNITS.index(unit)
        return 1 + len(_UNITS) + (0 if path.startswith("tests/integration/") else 1)

    items.sort(key=rank)  # stable: the order inside each rank stays pytest's
    for item in items:
        if _file_of(item.nodeid) in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # xdist is a dev dependency; without it the suite runs in one process
    LoadFileScheduling = None

if LoadFileScheduling is not None:

    class _FileOrCluster(LoadFileScheduling):
        """``--dist loadfile``, with every standalone-cluster file in one unit."""

        def _split_scope(self, nodeid: str) -> str:
            path = _file_of(nodeid)
            return CLUSTER_UNIT if path in STANDALONE_FILES else path

    def pytest_xdist_make_scheduler(config, log):
        """``make test`` runs ``-n 2 --dist loadfile``: files stay whole, clusters one at a time.

        (``--dist loadgroup`` cannot do it with pytest 9.2: xdist 3.8 writes the group into
        ``item._nodeid``, which pytest 9.2 no longer reads.)
        """
        if config.getvalue("dist") == "loadfile":
            # xdist reorders the units by their number of tests unless told not to: that put
            # test_chaos (1 test, minutes) last in the run of 2026-11-27 15:00. The order of
            # pytest_collection_modifyitems above is the one wanted.
            config.option.loadscopereorder = False
            return _FileOrCluster(config, log)
        return None
