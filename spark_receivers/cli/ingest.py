"""``spark-receivers ingest``: a source URI into a sink, until asked to stop or until it fails.

Order: every argument is parsed and checked (:func:`plan_ingest`), then what can
be checked on this machine is (:func:`preflight`: a local HTTP port is free, a
tailed directory exists), and only then does Spark start. The run ends when
``--seconds`` pass, on Ctrl-C/SIGTERM (a graceful stop: every received record is
processed first; a second Ctrl-C stops at once), or as soon as the streaming
context fails (a batch failed, a background part died): the command then stops
and exits 1 with the reason on its last line. So does a run whose source server
(socket, Redis, MQTT) stays unreachable for ``--unreachable-timeout``, or is
unreachable when the run stops (:mod:`spark_receivers.cli.source_watch`), and one
whose receiver never started and received nothing. See :mod:`spark_receivers.cli.outcome`.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_receivers.cli.live_view import JsonProgress, LiveView, view_owns_the_terminal
from spark_receivers.cli.outcome import EXIT_INTERRUPTED, EXIT_OK, judge
from spark_receivers.cli.progress import ProgressPrinter, one_line
from spark_receivers.cli.sinks import SinkSpec, parse_sink
from spark_receivers.cli.source_watch import SourceWatch, unreachable
from spark_receivers.cli.sources import Source, parse_source
from spark_receivers.cli.spark_session import (
    SparkSettings,
    is_local,
    spark_settings,
    start_spark,
    without_unavailable_status_page,
)
from spark_receivers.config import StreamingConfig
from spark_receivers.driver.tracking.receiver_launcher import check_local_cores
from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.rpc.hosts import local_host
from spark_receivers.spark.session_kind import spark_side
from spark_receivers.util.durations import parse_duration, parse_duration_ms
from spark_receivers.util.signals import wait_event

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_receivers.context import StreamingContext
    from spark_receivers.driver.observe.status import StreamingStatus

__all__ = ["IngestPlan", "parse_interval_ms", "parse_seconds", "plan_ingest", "preflight", "run"]

_SECRET_CONF = re.compile(r"secret|password|token|credential", re.IGNORECASE)
SETTLE_BOUND_S = 60.0
STOP_BOUND_S = 600.0
"""Longest wait for the context to finish stopping once asked (it has its own timeouts)."""


@dataclass(frozen=True)
class IngestPlan:
    """Everything ``ingest`` will do, checked, before Spark starts."""

    source: Source
    sink: SinkSpec
    spark: SparkSettings
    interval_ms: int
    seconds: float | None
    checkpoint: str | None
    wal: bool
    wal_flag: bool
    """``--wal`` itself (else the WAL, if on, comes from ``--conf``)."""
    unreachable_timeout_s: float = 120.0
    """How long the source's server may stay unreachable, the receiver failing."""
    progress: str = "lines"
    """``live``, ``lines`` or ``json`` (``--progress auto`` resolved)."""


def say(text: str) -> None:
    """One line to stderr (stdout is the console sink's)."""
    print(text, file=sys.stderr, flush=True)


def parse_interval_ms(
    text: str | None, legacy_ms: int | None, what: str = "--batch-interval"
) -> int:
    """The batch interval in ms (> 0): ``--batch-interval`` or ``--batch-interval-ms``.

    ``--batch-interval`` is a duration (a bare number is ms); ``--batch-interval-ms``
    is its deprecated alias.
    """
    if legacy_ms is not None:
        if text is not None:
            msg = f"give {what} or --batch-interval-ms, not both"
            raise ConfigError(msg)
        say(f"warning: --batch-interval-ms is deprecated: use {what} {legacy_ms}ms")
        text = str(legacy_ms)
    interval_ms = parse_duration_ms(text or "1s", what, "ms")
    if interval_ms <= 0:
        msg = f"{what} must be at least 1ms, got {text!r}"
        raise ConfigError(msg)
    return interval_ms


def parse_seconds(
    text: str | None, what: str = "--seconds", unset: str = "leave it out to run until Ctrl-C"
) -> float | None:
    """How long to run (a duration; bare numbers are seconds), > 0 and finite; None: no limit."""
    if text is None:
        return None
    stripped = text.strip().lower()
    if stripped.startswith("-") or stripped.lstrip("+") in ("inf", "infinity", "nan"):
        msg = f"{what} must be a finite duration > 0 such as 30s or 5min ({unset}), got {text!r}"
        raise ConfigError(msg)
    seconds = parse_duration(text, what, "s")
    if seconds <= 0:
        msg = f"{what} must be > 0 ({unset}), got {text!r}"
        raise ConfigError(msg)
    return seconds


def plan_ingest(args: argparse.Namespace) -> IngestPlan:
    """Parse and check every argument; no Spark, no network."""
    interval_ms = parse_interval_ms(args.batch_interval, args.batch_interval_ms)
    seconds = parse_seconds(args.seconds)
    unreachable_s = parse_seconds(
        args.unreachable_timeout, "--unreachable-timeout", "the default is 2min"
    )
    if unreachable_s is None:
        msg = "--unreachable-timeout must be given a duration, e.g. 2min"
        raise ConfigError(msg)
    source = parse_source(args.source)
    sink = parse_sink(args.sink, args.sink_option)
    settings = spark_settings(
        "spark-receivers-ingest",
        args.master,
        args.conf,
        ui=not args.no_ui,
        deploy_mode=args.deploy_mode,
        remote=getattr(args, "remote", None),
    )
    config = StreamingConfig.from_spark_conf(settings.conf_dict)  # --conf keys of ours, checked
    checkpoint = args.checkpoint or config.checkpoint_dir or None
    if checkpoint and "://" not in checkpoint:
        checkpoint = os.path.abspath(checkpoint)
        if os.path.exists(checkpoint) and not os.path.isdir(checkpoint):
            msg = f"--checkpoint {checkpoint} exists and is not a directory"
            raise ConfigError(msg)
    wal = bool(args.wal or config.receiver_wal_enabled)
    if wal and not checkpoint:
        msg = "--wal needs --checkpoint DIR (the write-ahead logs live there)"
        raise ConfigError(msg)
    check_local_cores(settings.master, 1)
    progress = progress_mode(getattr(args, "progress", "auto"), sink)
    return IngestPlan(
        source,
        sink,
        settings,
        interval_ms,
        seconds,
        checkpoint,
        wal,
        args.wal,
        unreachable_s,
        progress,
    )


def progress_mode(asked: str, sink: SinkSpec, out: Any = None, err: Any = None) -> str:
    """What ``--progress`` shows: ``auto`` resolved, ``json`` checked against the sink.

    ``auto`` is ``live`` when stdout and stderr are terminals and the sink does not
    print there itself, else ``lines``; ``json`` needs stdout for itself.
    """
    out, err = out or sys.stdout, err or sys.stderr
    if asked == "json" and sink.kind == "console":
        msg = (
            "--progress json prints to stdout, where the console sink prints its batches: "
            "pick another sink or --progress lines"
        )
        raise ConfigError(msg)
    if asked != "auto":
        return asked
    terminal = out.isatty() and err.isatty()
    return "live" if terminal and sink.kind != "console" else "lines"


def preflight(plan: IngestPlan) -> list[str]:
    """Checks on this machine (local masters): refuses what cannot work, returns warnings."""
    source, warnings = plan.source, []
    local = is_local(plan.spark.master)
    if local and source.listen is not None:
        host = source.listen[0] or local_host()
        _check_can_listen(source, host, source.listen[1])
    if local and source.directory is not None and not os.path.isdir(source.directory):
        what = "does not exist" if not os.path.exists(source.directory) else "is not a directory"
        msg = f"source {source.display}: {source.directory} {what}; create the directory first"
        raise ConfigError(msg)
    if source.server is not None:
        problem = unreachable(*source.server)
        if problem:
            warnings.append(
                f"{source.server[0]}:{source.server[1]} cannot be reached now ({problem}); "
                "the receiver keeps retrying with backoff (the run ends with status 1 if it "
                f"stays unreachable for --unreachable-timeout {plan.unreachable_timeout_s:g}s)"
            )
    if source.acknowledgement and not plan.wal:
        warnings.append(
            f"the write-ahead log is off: {source.acknowledgement} only means the records are "
            "in executor memory (on two executors when there are two); if the job fails "
            "before their batch is written (a sink error, the driver killed), they are lost "
            "although acknowledged. --checkpoint DIR --wal makes acknowledgements durable"
        )
    return warnings


def _check_can_listen(source: Source, host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            hint = {
                errno.EADDRINUSE: "another process holds the port: stop it or pick another port",
                errno.EADDRNOTAVAIL: f"{host} is not an address of this machine",
                errno.EACCES: "ports below 1024 need privileges: pick a port >= 1024",
            }.get(e.errno or 0, "")
            msg = f"source {source.display}: cannot listen on {host}:{port}: {e.strerror}"
            raise ConfigError(msg + (f" ({hint})" if hint else "")) from None


def run(
    args: argparse.Namespace, start: Callable[[SparkSettings], SparkSession] = start_spark
) -> int:
    """The ``ingest`` command; returns its exit status (ConfigError: the caller's exit 2)."""
    plan = plan_ingest(args)
    settings, page_warning = without_unavailable_status_page(plan.spark)
    plan = dataclasses.replace(plan, spark=settings)
    warnings = [page_warning] if page_warning else []
    warnings += preflight(plan)
    for warning in warnings:
        say(f"warning: {warning}")
    if args.check:
        _print_plan(plan)
        return EXIT_OK
    with view_owns_the_terminal(plan.progress == "live") as log_path:
        if log_path is not None:
            say(f"Spark's and the receivers' own log lines go to {log_path}")
        spark = start(plan.spark)
        try:
            return _stream(plan, spark)
        finally:
            spark.stop()


def _settle(
    spark: SparkSession, status: Callable[[], StreamingStatus], progress: ProgressPrinter
) -> None:
    """After a failure, end the batches still running before counting and reporting.

    A context that fails stops at once, but a batch that was already running goes on
    in the background: its jobs are cancelled (the run is over; its output would be
    partial) and it is waited for (bounded), so that the counts are final and the
    reason is the last thing printed.
    """
    running = progress.running()
    if not running:
        return
    spark_side(spark).cancel_all()
    deadline = time.monotonic() + SETTLE_BOUND_S
    while set(status().pending_batches_ms) & running and time.monotonic() < deadline:
        time.sleep(0.2)  # no event tells when a batch thread of a stopped context ends


def _wait(
    plan: IngestPlan, ssc: StreamingContext, wake: threading.Event
) -> tuple[SourceWatch | None, str | None]:
    """Until ``--seconds`` pass or ``wake`` is set, watching the source's server if it has one.

    Returns the watch and, when the server stayed unreachable for
    ``--unreachable-timeout`` with the receiver failing, the reason to end the run
    (the caller then stops the context).
    """
    if plan.source.server is None:
        wait_event(wake, plan.seconds)  # in slices: Ctrl-C is handled on this thread
        return None, None
    source_watch = SourceWatch(plan.source.server, plan.unreachable_timeout_s)
    deadline = None if plan.seconds is None else time.monotonic() + plan.seconds
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if (left is not None and left <= 0) or wake.wait(
            source_watch.probe_every_s if left is None else min(left, source_watch.probe_every_s)
        ):
            return source_watch, None
        receivers = ssc.status().receivers
        reason = source_watch.check(receivers[0]) if receivers else None
        if reason is not None:
            say(f"stopping: {reason}")
            return source_watch, reason


def _progress_printer(plan: IngestPlan, status: Callable[[], StreamingStatus]) -> ProgressPrinter:
    if plan.progress == "live":
        return LiveView(plan.interval_ms, status, f"{plan.source.display} -> {plan.sink.display}")
    if plan.progress == "json":
        return JsonProgress(plan.interval_ms, status)
    return ProgressPrinter(plan.interval_ms, status)


def _print_plan(plan: IngestPlan) -> None:
    """What ``--check`` prints: the run as it would start (secrets masked; to stdout)."""
    conf = {k: v for k, v in plan.spark.conf if not _SECRET_CONF.search(k)}
    lines = [
        f"source      {plan.source.display}",
        f"receiver    {plan.source.describe()}",
        f"sink        {plan.sink.display}",
        f"interval    {plan.interval_ms} ms",
        f"run for     {'until Ctrl-C' if plan.seconds is None else f'{plan.seconds:g} s'}",
        f"checkpoint  {plan.checkpoint or 'none'}; write-ahead log {'on' if plan.wal else 'off'}",
        f"progress    {plan.progress}",
        f"master      {plan.spark.master}",
        *(f"conf        {k}={v}" for k, v in sorted(conf.items()) if k != "spark.master"),
    ]
    print("\n".join(lines), flush=True)


def _stream(plan: IngestPlan, spark: SparkSession) -> int:
    from spark_receivers.context import StreamingContext, StreamingError

    sink = plan.sink.open(spark, plan.source.receiver.schema, say)
    # Only what the flags say is explicit: every other key still comes from --conf.
    config = StreamingConfig(receiver_wal_enabled=True) if plan.wal_flag else None

    def create() -> StreamingContext:
        ctx = StreamingContext(
            spark, plan.interval_ms, checkpoint_dir=plan.checkpoint, config=config
        )
        ctx.receiver_stream(plan.source.receiver).foreach_batch(sink, name=plan.sink.display)
        return ctx

    # With a checkpoint a restart recovers: the batches a killed run left unfinished run
    # again with the same blocks, and blocks it had received reach a batch.
    ssc = StreamingContext.get_or_create(plan.checkpoint, create) if plan.checkpoint else create()
    if ssc.recovered_from_checkpoint:
        say(f"recovering from the checkpoint in {plan.checkpoint}")
    progress = _progress_printer(plan, ssc.status)
    ssc.add_streaming_listener(progress)
    wake, stop_asked = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    unstarted: set[int] = set()  # receivers not registered when the graceful stop began

    def on_signal(signum: int, frame: Any) -> None:
        if stop_asked.is_set():
            say("stopping now: records not yet processed are dropped")
            os._exit(EXIT_INTERRUPTED)
        stop_asked.set()
        wake.set()

    def watch() -> None:
        try:
            ssc.await_termination()
        except StreamingError as e:
            failures.append(e)
        except BaseException as e:
            failures.append(e)
            raise
        finally:
            wake.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        ssc.start()
        interval = f"{plan.interval_ms} ms"
        say(
            f"ingesting {plan.source.display} -> {plan.sink.display} every {interval}; "
            "Ctrl-C stops gracefully"
        )
        url = ssc.status_page_url
        if url:
            say(f"status page {url}  (Prometheus: {url}metrics)")
        if isinstance(progress, LiveView):
            progress.start(url)
        watcher = threading.Thread(target=watch, name="ingest-await-termination", daemon=True)
        watcher.start()
        source_watch, gave_up = _wait(plan, ssc, wake)
        if not failures and watcher.is_alive():
            say("stopping gracefully (Ctrl-C again to stop at once) ...")
            unstarted.update(r.stream_id for r in ssc.status().receivers if r.endpoint is None)
            ssc.stop(graceful=True)
        watcher.join(STOP_BOUND_S)
        if watcher.is_alive():
            failures.append(
                TimeoutError(f"the streaming context did not stop in {STOP_BOUND_S:.0f}s")
            )
        elif source_watch is not None and gave_up is None and not failures:
            gave_up = source_watch.down_at_stop(ssc.status().receivers[0])
        if gave_up is not None:
            failures.append(ReceiverError(gave_up))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if isinstance(progress, LiveView):
            progress.stop()
    if failures:
        _settle(spark, ssc.status, progress)
    failure = one_line(failures[0]) if failures else None
    outcome = judge(
        ssc.status(), progress.counts(), failure, wal=plan.wal, unstarted_at_stop=unstarted
    )
    for line in outcome.lines:
        say(line)
    return outcome.code
