"""The child half of a benchmark step: runs in the subprocess that owns the JVM.

Protocol with the parent (``bench/step.py``):

1. The parent starts the load generator, then ``python -m <module> <system> --port P ...``.
2. The child starts Spark and its pipeline; its receiver connects, which starts the load
   generator's clock. The pipeline reports every batch to a :class:`BatchRecorder`; once a
   batch has its timings, its scheduling delay and its line count, the child prints it on
   stdout as ``BATCH_PREFIX + json`` (again after every later update), so that the parent
   can judge each rate step of the session while the next one runs.
3. When the send window is over the parent writes one JSON line to the child's stdin:
   ``{"lines_sent": N}``. The child waits until its pipeline processed N lines or
   ``drain_s`` passed, stops Spark, and prints one line ``RESULT_PREFIX + json`` on stdout:
   ``{"batches": [BatchSample as dict, ...], "error": str | null, "extra": {...}}``.

Spark's logs go to stderr (the parent writes them to ``bench/out/logs/``).

A new system's child is a function ``pipeline(args, recorder) -> stop`` passed to
:func:`child_main`; see ``bench/peers.py`` for two.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BATCH_PREFIX",
    "RESULT_PREFIX",
    "BatchRecorder",
    "ChildArgs",
    "Pipeline",
    "child_main",
    "epoch_ms_to_monotonic",
    "local_session",
    "spark_conf",
    "warmup_lines",
]

log = logging.getLogger(__name__)

RESULT_PREFIX = "BENCH_RESULT "
BATCH_PREFIX = "BENCH_BATCH "
WINDOW_S, SLIDE_S = 30, 1
"""The ``windowed`` pipeline: a word count over the last 30 s, every second, updated a slide
at a time with the inverse function (``reduceByKeyAndWindow(add, sub, 30, 1)``)."""


@dataclass(frozen=True)
class ChildArgs:
    """What the parent asks of one child run."""

    system: str
    port: int
    seconds: float
    batch_interval_s: float
    master: str
    pipeline: str
    drain_s: float
    host: str = "127.0.0.1"
    cold: bool = False
    """As users start a stream: no warm-up job, the source connects at start (cold start)."""

    @property
    def batch_interval_ms(self) -> int:
        return round(self.batch_interval_s * 1000)

    @property
    def ingest_only(self) -> bool:
        return self.pipeline == "ingest"

    @property
    def two_actions(self) -> bool:
        """``count()`` before the word count, on the same batch (two Spark actions)."""
        return self.pipeline == "two_action"

    @property
    def windowed(self) -> bool:
        """``count()`` of the batch, then the word count over :data:`WINDOW_S` every
        :data:`SLIDE_S`, incremental with the inverse function, collected."""
        return self.pipeline == "windowed"


def parse_child_args(argv: list[str] | None = None) -> ChildArgs:
    p = argparse.ArgumentParser(description="one benchmark step (run by bench/step.py)")
    p.add_argument("system")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--batch-interval", type=float, default=1.0)
    p.add_argument("--master", default="local[4]")
    p.add_argument(
        "--pipeline", default="wordcount", choices=["wordcount", "two_action", "ingest", "windowed"]
    )
    p.add_argument("--drain", type=float, default=4.0, help="seconds to wait for the backlog")
    p.add_argument("--json", action="store_true", help="print the result line (always on)")
    p.add_argument("--cold", action="store_true", help="no warm-up; connect at start")
    a = p.parse_args(argv)
    return ChildArgs(
        system=a.system,
        port=a.port,
        seconds=a.seconds,
        batch_interval_s=a.batch_interval,
        master=a.master,
        pipeline=a.pipeline,
        drain_s=a.drain,
        cold=a.cold,
    )


def spark_conf(args: ChildArgs) -> dict[str, str]:
    """The Spark settings every system gets, so they run on equal terms."""
    cores = args.master.removeprefix("local[").removesuffix("]")
    partitions = cores if cores.isdigit() else "4"
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.memory": "2g",
        # The default 200 shuffle partitions cost ~1 s per batch on a small machine; every
        # tuned deployment lowers it to the core count, and DStream's reduceByKey uses that.
        "spark.sql.shuffle.partitions": partitions,
        "spark.default.parallelism": partitions,
        "spark.sql.streaming.numRecentProgressUpdates": "10000",
    }


def local_session(app_name: str, master: str = "local[4]") -> Any:
    """A Spark session in this process with the ladder's settings (:func:`spark_conf`), bound
    to loopback, its Python workers on this interpreter, logging errors only."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = spark_conf(ChildArgs(app_name, 0, 0.0, 1.0, master, "wordcount", 0.0))
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def warmup_lines(n: int = 20_000) -> list[str]:
    """Lines like the load generator's, for a warm-up job before the stream starts.

    Every system runs its batch pipeline once on these before connecting, so the measured
    window sees warm Python workers and JIT-compiled JVM code, not a cold start.
    """
    from spark_receivers.receivers.lines import LinePool

    pool = LinePool(seed=1)
    return [pool.line(i).decode().rstrip("\n") for i in range(n)]


def epoch_ms_to_monotonic(epoch_ms: float, offset_s: float) -> float:
    """Convert a JVM wall-clock time to monotonic seconds; ``offset_s = time() - monotonic()``."""
    return epoch_ms / 1000.0 - offset_s


class BatchRecorder:
    """Collects per-batch fields from several threads; counts processed lines.

    ``update`` may be called from any thread (Spark's listener thread, the foreachRDD /
    foreachBatch callback thread) and never blocks beyond a short lock. ``on_update`` is
    called under that lock with a copy of the entry after every update that changes it and
    leaves it holding every field of ``LIVE_FIELDS``; it must be quick (the child prints a
    line).
    """

    LIVE_FIELDS = ("batch_time_s", "completed_s", "lines", "processing_ms", "scheduling_delay_ms")

    def __init__(self, on_update: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._cond = threading.Condition(threading.RLock())  # wait_for predicates re-enter
        self._batches: dict[int, dict[str, Any]] = {}
        self._lines = 0
        self._on_update = on_update

    def update(self, batch_id: int, **fields: Any) -> None:
        with self._cond:
            entry = self._batches.setdefault(batch_id, {"batch_id": batch_id})
            changed = any(k not in entry or entry[k] != v for k, v in fields.items())
            if "lines" in fields:
                self._lines += fields["lines"] - entry.get("lines", 0)
            entry.update(fields)
            # Pipelines may repeat an update (Structured's progress is polled in full):
            # only a change is reported again.
            if (
                changed
                and self._on_update is not None
                and all(k in entry for k in self.LIVE_FIELDS)
            ):
                self._on_update(dict(entry))
            self._cond.notify_all()

    @property
    def lines(self) -> int:
        with self._cond:
            return self._lines

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` (evaluated under the lock after every update) holds."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout_s)

    def entries(self) -> list[dict[str, Any]]:
        with self._cond:
            return [dict(e) for e in self._batches.values()]


Stop = Callable[[], dict[str, Any]]
"""Stops the pipeline; returns ``extra`` fields for the result (may be empty)."""

Pipeline = Callable[[ChildArgs, BatchRecorder], Stop]
"""Starts Spark and the stream for ``args`` and returns how to stop it.

Must report every batch with ``recorder.update(batch_id, ...)`` so that each entry ends up
with the :class:`bench.harness.BatchSample` fields: ``batch_time_s``, ``completed_s``
(monotonic), ``lines``, ``processing_ms`` and optionally ``scheduling_delay_ms``, ``records``.
"""

_REQUIRED = ("batch_time_s", "completed_s", "lines", "processing_ms")


def _read_lines_sent() -> int | None:
    line = sys.stdin.readline()  # blocks until the parent's window is over; "" if it died
    if not line:
        return None
    return int(json.loads(line)["lines_sent"])


_BATCH_RECORD: Callable[[Any, int, float], None] | None = None


def set_batch_record(record: Callable[[Any, int, float], None]) -> None:
    """Give :func:`count_lines_of_batch` the running child's ``record(time, lines, started)``."""
    global _BATCH_RECORD  # one system's run per child process
    _BATCH_RECORD = record


def count_lines_of_batch(t: Any, rdd: Any) -> None:
    """A DStream ``foreachRDD`` function counting a batch's lines into the child's record.

    A function of an importable module: DStream checkpointing (the windowed run) pickles
    every ``foreachRDD`` function, and cloudpickle pickles this one by its name, where a
    closure over the recorder (it holds a lock), or a function of ``__main__``, cannot be.
    """
    started = time.monotonic()
    assert _BATCH_RECORD is not None
    _BATCH_RECORD(t, rdd.count(), started)


def child_main(pipelines: Mapping[str, Pipeline], argv: list[str] | None = None) -> int:
    """Run one step for ``args.system`` from ``pipelines`` and print the result line."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parse_child_args(argv)

    def emit(entry: dict[str, Any]) -> None:
        print(BATCH_PREFIX + json.dumps(entry), flush=True)

    recorder = BatchRecorder(on_update=emit)
    error: str | None = None
    extra: dict[str, Any] = {}
    stop: Stop | None = None
    try:
        if args.system not in pipelines:
            raise ValueError(f"unknown system {args.system!r}; known: {sorted(pipelines)}")
        stop = pipelines[args.system](args, recorder)
        lines_sent = _read_lines_sent()
        if lines_sent is None:
            error = "parent closed stdin before the window ended"
        else:
            drained = recorder.wait_for(lambda: recorder.lines >= lines_sent, args.drain_s)
            extra["drained"] = drained
    except Exception as e:
        traceback.print_exc()
        error = f"{type(e).__name__}: {e}"
    finally:
        if stop is not None:
            t = time.monotonic()
            try:
                extra.update(stop())
            except Exception as e:
                traceback.print_exc()
                error = error or f"stop failed: {type(e).__name__}: {e}"
            extra["stop_s"] = round(time.monotonic() - t, 2)
    batches = []
    for entry in sorted(recorder.entries(), key=lambda e: e["batch_id"]):
        if "lines" in entry and "completed_s" in entry and "processing_ms" not in entry:
            # The engine's timing report never came (stopped mid-report): keep the lines,
            # with the output callback's own timing.
            entry.setdefault("processing_ms", entry.get("fb_processing_ms", 0.0))
            entry.setdefault("batch_time_s", entry["completed_s"] - entry["processing_ms"] / 1000)
            extra["estimated_timings"] = extra.get("estimated_timings", 0) + 1
        missing = [k for k in _REQUIRED if k not in entry]
        if missing:
            # A batch cut short by the stop: its lines still count, its timings do not exist.
            extra.setdefault("incomplete_batches", []).append({**entry, "missing": missing})
            continue
        batches.append(entry)
    incomplete_lines = sum(e.get("lines", 0) for e in extra.get("incomplete_batches", []))
    if incomplete_lines:
        extra["lines_in_incomplete_batches"] = incomplete_lines
    print(
        RESULT_PREFIX + json.dumps({"batches": batches, "error": error, "extra": extra}), flush=True
    )
    return 0
