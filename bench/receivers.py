"""spark-receivers in the throughput ladder: the system the peers are measured against.

- ``spark_receivers``: a :class:`~spark_receivers.SocketTextReceiver` on the load generator,
  receiver WAL off, one ``foreach_batch`` output operation.
- ``spark_receivers_wal``: the same with ``StreamingConfig(receiver_wal_enabled=True)`` and a
  ``checkpoint_dir`` (receiver and driver WAL on). Whether the WAL was really in effect is
  *measured*, not assumed: the child reports whether the driver's block tracker holds a WAL,
  how many blocks carried a WAL handle and how many bytes landed under the checkpoint
  directory (``extra["wal"]``); :func:`wal_status` turns that into a verdict that
  ``bench/run.py`` prints in BENCHMARKS.md.
- ``spark_receivers_nocache``: WAL off, ``batch_cache=False`` (not in the default run).
- ``spark_receivers_parquetspool``: WAL off, ``batch_parquet_spool=True``: blocks spooled as
  Parquet and read by Spark's own Parquet reader (decision 0026; not in the default run).
- ``spark_receivers_connect``: WAL off, through Spark Connect (issue 34; not in the default
  run): the child starts a Connect server of the installed pyspark
  (``spark_receivers.testing.start_connect_server``: ``local[4]``, the same
  :func:`~bench.child.spark_conf` as ``--conf``, loopback only) before the measured window,
  joins it with a Connect client session (the driver's parts run in the child) and runs the
  same pipeline; the server's JVM runs the receiver's task and the batches' jobs. The
  server is stopped by its PID at the end; its start time is reported apart
  (``extra["connect_server"]``).

The word count is the peers' (see ``bench/peers.py``): split on spaces, replace the sequence
number by ``#lines``, count per word, collect; the count of ``#lines`` is the batch's line
count. ``ingest`` counts the lines; ``two_action`` runs ``count()`` and then the word count
on each batch. Per-batch timings come from a
:class:`~spark_receivers.StreamingListener` (``BatchInfo``: scheduling and processing delay,
processing end); the ``foreach_batch`` callback records the line count (and fallback timings).

Runners (parent side) have the :class:`bench.harness.Runner` signature; the children are
``python -m bench.receivers <system> --port P --seconds S ...`` (see ``bench/child.py``).
"""

from __future__ import annotations

import contextlib
import operator
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Protocol

from bench.child import (
    SLIDE_S,
    WINDOW_S,
    BatchRecorder,
    ChildArgs,
    Pipeline,
    Stop,
    child_main,
    spark_conf,
    warmup_lines,
)
from bench.harness import Runner, StepResult
from bench.pipelines import batch_query, words
from bench.step import run_child_session

__all__ = [
    "WAL_SYSTEMS",
    "run_spark_receivers",
    "run_spark_receivers_connect",
    "run_spark_receivers_nocache",
    "run_spark_receivers_parquetspool",
    "run_spark_receivers_wal",
    "wal_status",
]

GATE_TIMEOUT_S = 90.0  # the receiver's own bound on waiting for the gate
REGISTER_TIMEOUT_S = 60.0  # the gate opens at most this long after start if not registered
IDLE_TIMEOUT_S = 20.0  # ... and at most this long after registration if never idle
# Both well inside the load generator's 180 s accept timeout, which also covers the JVM
# start and warm-up: on an overloaded machine a backlog may never drain, and then the step
# must measure it rather than time out.
WAL_SYSTEMS = ("spark_receivers_wal",)
"""Systems that ask for the WAL; their steps carry ``extra["wal"]``."""


class Feed(Protocol):
    """Another source between the load generator and the receiver (the Redis ladder's)."""

    def receiver(self) -> Any:
        """The receiver the stream reads (its source must be up when it starts)."""

    def open(self, host: str, port: int) -> None:
        """Connect to the load generator at ``host:port`` and pass its lines on; returns."""

    def close(self) -> dict[str, Any]:
        """Stop passing lines, stop the source; what it counted, for the step's extra."""


# -- parent side ------------------------------------------------------------------------------


run_spark_receivers: Runner = partial(run_child_session, "spark_receivers", "bench.receivers")
"""spark-receivers word count (or line count), receiver WAL off, one session."""


run_spark_receivers_wal: Runner = partial(
    run_child_session, "spark_receivers_wal", "bench.receivers"
)
"""spark-receivers word count (or line count), receiver + driver WAL on, one session."""


run_spark_receivers_connect: Runner = partial(
    run_child_session, "spark_receivers_connect", "bench.receivers"
)
"""spark-receivers word count (or line count), WAL off, in a Spark Connect client session of a
server the child starts before the measured window (issue 34)."""


run_spark_receivers_nocache: Runner = partial(
    run_child_session, "spark_receivers_nocache", "bench.receivers"
)
"""spark-receivers with ``batch_cache=False`` (every action reads the blocks again): what the
batch cache costs a one-action pipeline and saves a two-action one. Not in the default run."""


run_spark_receivers_parquetspool: Runner = partial(
    run_child_session, "spark_receivers_parquetspool", "bench.receivers"
)
"""spark-receivers with ``batch_parquet_spool=True`` (Parquet spool files read by Spark's own
reader): what it saves or costs against the default (decision 0026). Not in the default run."""


def wal_status(steps: Sequence[StepResult]) -> str:
    """One line per WAL system saying whether its WAL was in effect in these steps.

    In effect means: the driver's block tracker had a WAL, at least one block carried a WAL
    handle, and bytes were written under the checkpoint directory. A step whose child could
    not even start with the WAL (the context raised) says so through its ``error``.
    """
    lines = []
    for system in dict.fromkeys(s.system for s in steps if s.system in WAL_SYSTEMS):
        reports = [s.extra.get("wal") for s in steps if s.system == system]
        seen = [r for r in reports if isinstance(r, Mapping)]
        errors = [s.error for s in steps if s.system == system and s.error]
        if not seen:
            why = f" ({errors[0][:160]})" if errors else ""
            lines.append(f"- `{system}`: no WAL report from any step{why}.")
            continue
        driver = all(bool(r.get("driver_wal")) for r in seen)
        blocks = sum(int(r.get("blocks_with_wal_handle", 0)) for r in seen)
        total = sum(int(r.get("blocks", 0)) for r in seen)
        written = sum(int(r.get("checkpoint_bytes", 0)) for r in seen)
        facts = (
            f"driver WAL {'on' if driver else 'off'}, {blocks:,}/{total:,} blocks with a WAL "
            f"handle, {written:,} bytes on disk under the checkpoint dir at the end"
        )
        if driver and blocks and written:
            lines.append(f"- `{system}`: WAL in effect ({facts}).")
        else:
            lines.append(
                f"- **`{system}`: the WAL was NOT in effect** ({facts}): the context accepted "
                "`receiver_wal_enabled=True` but did not wire the WAL, so these numbers are "
                "WAL-off numbers and say nothing about the cost of the WAL."
            )
    return "\n".join(lines)


# -- child side -------------------------------------------------------------------------------


def _dir_bytes(path: str | None) -> int:
    if not path:
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            # A segment rolled or cleaned while we walked: not there to count.
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def _spark_receivers(
    args: ChildArgs,
    recorder: BatchRecorder,
    *,
    wal: bool,
    batch_cache: bool = True,
    parquet_spool: bool = False,
    feed: Feed | None = None,
    connect: bool = False,
) -> Stop:
    """The spark-receivers child: a socket receiver on the load generator, or ``feed``'s.

    With a ``feed`` (``bench/redis_positions.py``), its receiver reads the stream instead
    and the feed connects to the load generator when the gate opens. With ``connect``
    the child first starts a Spark Connect server (``args.master``, :func:`spark_conf`
    as its ``--conf``, loopback only) and the pipeline runs in a Connect client session
    of it; the server is stopped by its PID at the end.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_receivers import (
        BatchInfo,
        SocketTextReceiver,
        StreamingConfig,
        StreamingContext,
        StreamingListener,
    )

    name = "spark-receivers-wal" if wal else "spark-receivers"
    name += "-connect" if connect else ""
    app_name = f"bench-{name}-{args.pipeline}"
    server: _ConnectServer | None = None
    if connect:
        # As a Connect user: the server is up before the user's program starts.
        server = _start_connect_server(args, app_name)
    began = time.monotonic()  # the user's program: the session, then the stream
    if server is not None:
        spark = SparkSession.builder.remote(server.url).getOrCreate()
    else:
        builder = SparkSession.builder.master(args.master).appName(app_name)
        for k, v in spark_conf(args).items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()  # starts the JVM
        spark.sparkContext.setLogLevel("WARN")
    session_s = time.monotonic() - began
    lines_in = batch_query(args.pipeline)

    # The peers warm their batch pipeline; ours reads blocks in mapInArrow tasks
    # from a Flight block server, so warm exactly that (the first read of a cold worker costs
    # ~10 s on this machine, which would otherwise land in the measured window).
    if not args.cold:
        _warm_block_source(spark, lines_in)

    checkpoint = tempfile.mkdtemp(prefix="bench-receivers-") if wal else None
    # Bounded stop: the harness drains before stopping, so nothing is left to serve.
    config = StreamingConfig(
        batch_cache=batch_cache,
        batch_parquet_spool=parquet_spool,
        receiver_wal_enabled=wal,
        receiver_drain_timeout_s=5.0,
        receiver_stop_timeout_s=5.0,
    )
    ssc = StreamingContext(
        spark, batch_interval_ms=args.batch_interval_ms, checkpoint_dir=checkpoint, config=config
    )
    offset_s = time.time() - time.monotonic()  # the context's SystemClock is wall-clock ms

    def mono(epoch_ms: float) -> float:
        return epoch_ms / 1000.0 - offset_s

    class Listener(StreamingListener):
        # Runs on the context's listener bus thread; must not block.
        def on_batch_completed(self, info: BatchInfo) -> None:
            fields: dict[str, Any] = {
                "batch_time_s": mono(info.batch_time_ms),
                "records": int(info.num_records),
            }
            if info.scheduling_delay_ms is not None:
                fields["scheduling_delay_ms"] = float(info.scheduling_delay_ms)
            if info.processing_delay_ms is not None:
                fields["processing_ms"] = float(info.processing_delay_ms)
            if info.processing_end_time_ms is not None:
                fields["completed_s"] = mono(info.processing_end_time_ms)
            recorder.update(info.batch_time_ms, **fields)

    ssc.add_streaming_listener(Listener())
    wal_blocks = {"blocks": 0, "blocks_with_wal_handle": 0}
    wal_lock = threading.Lock()

    def on_batch(df: Any, batch_time_ms: int) -> None:
        # Runs on the context's batch thread; blocking here is the batch.
        started = time.monotonic()
        n = lines_in(df)
        now = time.monotonic()
        recorder.update(
            batch_time_ms,
            batch_time_s=mono(batch_time_ms),
            lines=int(n),
            completed_s=now,
            fb_processing_ms=(now - started) * 1000,
        )
        if wal:
            # The blocks themselves are not public: read them off the scheduler (bench only).
            block_tracker = ssc._scheduler.block_tracker  # type: ignore[union-attr]
            blocks = [b for bs in block_tracker.get_blocks_of_batch(batch_time_ms).values()
                      for b in bs]  # fmt: skip
            with wal_lock:
                wal_blocks["blocks"] += len(blocks)
                with_handle = sum(b.wal_handle is not None for b in blocks)
                wal_blocks["blocks_with_wal_handle"] += with_handle

    gate = os.path.join(tempfile.mkdtemp(prefix="bench-gate-"), "open")
    if feed is not None:
        receiver = feed.receiver()
    elif args.cold:  # as users start a stream: the receiver connects as soon as it runs
        receiver = SocketTextReceiver(args.host, args.port)
    else:
        receiver = _gated_receiver_class(SocketTextReceiver)(args.host, args.port, gate=gate)
    stream = ssc.receiver_stream(receiver).foreach_batch(on_batch, "word_count")
    if args.windowed:
        pairs = stream.transform(
            lambda df: df.select(F.explode(words()).alias("word"), F.lit(1).alias("n"))
        )
        pairs.reduce_by_key_and_window(
            operator.add, operator.sub, WINDOW_S * 1000, SLIDE_S * 1000, key="word", value="n"
        ).foreach_batch(lambda df, t: df.collect(), "windowed_word_count")
    started = time.monotonic()
    ssc.start()
    extra_start: dict[str, Any] = {
        "start_returned_after_s": round(time.monotonic() - started, 2),
        "session_s": round(session_s, 2),
    }
    if server is not None:
        extra_start["connect_server_start_s"] = round(server.start_s, 2)
    if args.cold:
        startup = extra_start
    else:
        startup = {
            **extra_start,
            **_open_gate_when_idle(ssc, recorder, gate, started, args.batch_interval_s),
        }
    if feed is not None:
        feed.open(args.host, args.port)

    def stop() -> dict[str, Any]:
        # Listener events trail the output callback; give the last ones a moment.
        recorder.wait_for(lambda: _all_have(recorder, "records"), 3 * args.batch_interval_s)
        first = _first_batch_completed(recorder)
        if first is not None:
            startup["first_batch_after_s"] = round(first - began, 2)
        extra: dict[str, Any] = {"spark_version": spark.version, "startup": startup}
        extra["records_received"] = ssc.status().records_received
        if wal:
            extra["wal"] = {
                "driver_wal": bool(ssc.checkpoint_dir),
                **wal_blocks,
                "checkpoint_bytes": _dir_bytes(checkpoint),
            }
        ssc.stop(graceful=False)
        if feed is not None:
            extra["feed"] = feed.close()
        spark.stop()
        if server is not None:
            server.stop()
            extra["connect_server"] = {"pid": server.pid, "start_s": round(server.start_s, 2)}
        if checkpoint:
            shutil.rmtree(checkpoint, ignore_errors=True)
        shutil.rmtree(os.path.dirname(gate), ignore_errors=True)
        return extra

    return stop


class _ConnectServer:
    """The Connect child's server: its URL, PID and start time; stopped by PID once."""

    def __init__(self, proc: Any, port: int, start_s: float, workdir: str) -> None:
        self.proc = proc
        self.url = f"sc://127.0.0.1:{port}"
        self.pid = int(proc.pid)
        self.start_s = start_s
        self.workdir = workdir
        self._stopped = False

    def stop(self) -> None:
        """Stop the server by its PID and remove its log (idempotent)."""
        from spark_receivers.testing import stop_connect_server

        if self._stopped:
            return
        self._stopped = True
        stop_connect_server(self.proc)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _start_connect_server(args: ChildArgs, app_name: str) -> _ConnectServer:
    """A Spark Connect server of ``args.master`` with the ladder's settings, loopback only.

    Its log goes to a temporary directory, removed at the stop; a failed start raises
    with the log's tail. Stopped at the child's exit if the pipeline
    fails before its ``stop`` (the parent kills the child's process group otherwise).
    """
    import atexit
    from pathlib import Path

    from spark_receivers.testing import start_connect_server

    workdir = tempfile.mkdtemp(prefix="bench-connect-")
    t = time.monotonic()
    proc, port = start_connect_server(
        Path(workdir) / "server.log", master=args.master, conf=spark_conf(args), app_name=app_name
    )
    server = _ConnectServer(proc, port, time.monotonic() - t, workdir)
    atexit.register(server.stop)
    return server


def _first_batch_completed(recorder: BatchRecorder) -> float | None:
    """When (monotonic s) the first batch that processed lines completed, if one did."""
    done = [e for e in recorder.entries() if e.get("lines") and "completed_s" in e]
    return min(done, key=lambda e: e["batch_id"])["completed_s"] if done else None


def _gated_receiver_class(base: type) -> type:
    """``base`` (a SocketTextReceiver) that connects only once the file ``gate`` exists.

    Runs in the receiver's task (another process in local mode, same filesystem).
    """

    class GatedSocketTextReceiver(base):  # type: ignore[misc, valid-type]
        def __init__(self, host: str, port: int, *, gate: str, **kwargs: Any) -> None:
            super().__init__(host, port, **kwargs)
            self.gate = gate

        def on_start(self) -> None:
            threading.Thread(target=self._wait_then_start, daemon=True).start()

        def _wait_then_start(self) -> None:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            # A file in another process: no Event to wait on, so poll it (bench only).
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                if self.is_stopped():
                    return
                time.sleep(0.02)
            base.on_start(self)

    return GatedSocketTextReceiver


def _open_gate_when_idle(
    ssc: Any, recorder: BatchRecorder, gate: str, started: float, batch_interval_s: float
) -> dict[str, Any]:
    """Let the receiver connect once the context's start-up backlog is gone.

    Start-up (launching the receiver's task, the first batches) queues batches behind a
    slow first one; the load generator's clock starts at the connection, so the window
    would otherwise measure the start-up backlog draining, not the steady state. Returns the
    start-up timings for the step's ``extra``.
    """
    from spark_receivers.driver.tracking.scheduling_policy import ReceiverState

    def registered() -> bool:
        return any(r.state == ReceiverState.ACTIVE.name for r in ssc.status().receivers)

    def idle() -> bool:
        done = [e for e in recorder.entries() if "scheduling_delay_ms" in e]
        last = max(done, key=lambda e: e["batch_id"]) if done else None
        return last is not None and last["scheduling_delay_ms"] < 0.2 * batch_interval_s * 1000

    out: dict[str, Any] = {}
    recorder.wait_for(registered, REGISTER_TIMEOUT_S)  # batch updates wake it; bounded anyway
    out["receiver_registered_after_s"] = round(time.monotonic() - started, 2)
    out["idle_at_gate"] = recorder.wait_for(lambda: registered() and idle(), IDLE_TIMEOUT_S)
    out["gate_opened_after_s"] = round(time.monotonic() - started, 2)
    first = [e for e in recorder.entries() if "processing_ms" in e]
    if first:
        out["first_batch_processing_ms"] = min(first, key=lambda e: e["batch_id"])["processing_ms"]
        out["max_startup_scheduling_delay_ms"] = max(
            e.get("scheduling_delay_ms", 0.0) for e in first
        )
    with open(gate, "w"):
        pass
    return out


def _warm_block_source(spark: Any, lines_in: Any, blocks: int = 5) -> None:
    """Run the batch pipeline twice on warm-up lines read as blocks from a block server."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    from spark_receivers.receiver.schema import DEFAULT_SCHEMA
    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.auth import new_secret
    from spark_receivers.rpc.transport import FlightEndpoint
    from spark_receivers.spark import block_source

    lines = warmup_lines()
    per = len(lines) // blocks
    tables = {
        f"input-0-1-{i}": pa.table({"value": pa.array(lines[i * per : (i + 1) * per], pa.string())})
        for i in range(blocks)
    }
    secret = new_secret()
    server = FlightEndpoint(
        "bench-warmup", "127.0.0.1", secret, m.SUPERVISOR_MESSAGES, lambda _: True,
        lambda ticket: tables[ticket.decode()],
    )  # fmt: skip
    try:
        infos = [
            m.ReceivedBlockInfo(0, name, t.num_rows, 0, server.address, t.nbytes)
            for name, t in tables.items()
        ]
        schema = from_arrow_schema(DEFAULT_SCHEMA)
        for _ in range(2):
            lines_in(block_source.blocks_dataframe(spark, infos, schema, secret))
            lines_in(spark.createDataFrame([], schema))  # what a batch without blocks reads
    finally:
        server.close()


def _all_have(recorder: BatchRecorder, key: str) -> bool:
    return all(key in e for e in recorder.entries() if e.get("lines"))


def _wal_off(args: ChildArgs, recorder: BatchRecorder) -> Stop:
    return _spark_receivers(args, recorder, wal=False)


def _wal_on(args: ChildArgs, recorder: BatchRecorder) -> Stop:
    return _spark_receivers(args, recorder, wal=True)


def _no_cache(args: ChildArgs, recorder: BatchRecorder) -> Stop:
    return _spark_receivers(args, recorder, wal=False, batch_cache=False)


def _parquet_spool(args: ChildArgs, recorder: BatchRecorder) -> Stop:
    return _spark_receivers(args, recorder, wal=False, parquet_spool=True)


def _connect(args: ChildArgs, recorder: BatchRecorder) -> Stop:
    return _spark_receivers(args, recorder, wal=False, connect=True)


PIPELINES: dict[str, Pipeline] = {
    "spark_receivers": _wal_off,
    "spark_receivers_wal": _wal_on,
    "spark_receivers_nocache": _no_cache,
    "spark_receivers_parquetspool": _parquet_spool,
    "spark_receivers_connect": _connect,
}

if __name__ == "__main__":
    sys.exit(child_main(PIPELINES))
