"""The ``spark-receivers`` command line: ``demo`` and ``ingest``.

Every bad argument is one line on stderr, ``error: ...``, and exit status 2,
before Spark starts whenever it can be known then (see
:mod:`spark_receivers.cli.outcome` for the other statuses).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import metadata
from typing import NoReturn

from spark_receivers.cli.outcome import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE
from spark_receivers.cli.sinks import SINK_KINDS
from spark_receivers.errors import ConfigError, SparkReceiversError

__all__ = ["build_parser", "main"]

DESCRIPTION = (
    "Receiver-based stream ingestion for PySpark: 'demo' runs a word count on local "
    "Spark; 'ingest' streams a source URI into a sink."
)
SOURCES_HELP = (
    "socket://HOST:PORT, http://[HOST][:PORT][/PATH][?token=&format=json], "
    "file:///ABS/DIR[?pattern=*.log], redis[s]://[:PW@]HOST[:PORT]/[DB/]STREAM?group=G, "
    "mqtt[s]://[USER:PW@]HOST[:PORT]/TOPIC[?qos=&client_id=], generator://?rate=N"
)


class _ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: ... (see PROG --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from spark_receivers import __version__

    try:
        pyspark = metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        pyspark = "not installed"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"spark-receivers {__version__} (pyspark {pyspark}, python {python})"


def _spark_flags(p: argparse.ArgumentParser, master_default: str | None, master_help: str) -> None:
    p.add_argument("--master", default=master_default, help=master_help)
    p.add_argument(
        "--remote",
        default=None,
        metavar="sc://HOST:PORT",
        help="run on a Spark Connect server (pip install 'spark-receivers[connect]'); the "
        "driver's parts run here and the server's executors must reach this machine",
    )
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark conf entry (repeatable): Spark's keys and ours (spark.streaming.*, "
        "spark.receivers.*)",
    )
    p.add_argument(
        "--no-ui",
        action="store_true",
        help="neither the Spark UI nor the status page with /metrics (both on by default)",
    )


def _interval_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-interval",
        default=None,
        metavar="DURATION",
        help="batch interval, e.g. 1s, 500ms, 1min (a bare number is ms; default 1s)",
    )
    p.add_argument(
        "--batch-interval-ms", type=int, default=None, help=argparse.SUPPRESS
    )  # deprecated alias


def build_parser() -> argparse.ArgumentParser:
    """The parser of both commands (no Spark)."""
    parser = _ArgumentParser(prog="spark-receivers", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)
    p = sub.add_parser("demo", help="streaming word count over a built-in local line source")
    p.add_argument(
        "--seconds",
        default="20s",
        metavar="DURATION",
        help="how long it streams once the receiver runs (20s)",
    )
    p.add_argument(
        "--rate", type=float, default=20_000.0, help="lines per second offered (default 20000)"
    )
    _interval_flags(p)
    _spark_flags(
        p,
        "local[4]",
        "Spark master (default local[4]); on a cluster (spark://...) the line source "
        "listens on spark.driver.host",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.set_defaults(command_module="demo")
    q = sub.add_parser(
        "ingest",
        help="stream a source URI into a sink",
        description="Stream a source URI into a sink until --seconds pass, Ctrl-C, or a failure. "
        "Exit status: 0 stopped as asked with every received record processed; 1 the stream "
        "failed, its source's server was unreachable, or it left records unprocessed; 2 a bad "
        "argument; 130 a second Ctrl-C.",
    )
    q.add_argument("--source", required=True, metavar="URI", help=SOURCES_HELP)
    q.add_argument("--sink", required=True, metavar="SINK", help=SINK_KINDS)
    q.add_argument(
        "--sink-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a writer option of the sink (repeatable); {batch_time_ms} in a value is the "
        "batch time",
    )
    _interval_flags(q)
    q.add_argument("--checkpoint", default=None, metavar="DIR", help="checkpoint directory")
    q.add_argument(
        "--wal", action="store_true", help="write-ahead logs: nothing acknowledged is lost"
    )
    q.add_argument(
        "--seconds",
        default=None,
        metavar="DURATION",
        help="stop after this long, e.g. 30s, 10min (a bare number is seconds; default: "
        "until Ctrl-C)",
    )
    q.add_argument(
        "--unreachable-timeout",
        default="2min",
        metavar="DURATION",
        help="end the run (status 1) when the source's server (socket, Redis, MQTT) cannot be "
        "reached and the receiver keeps failing for this long (default 2min)",
    )
    _spark_flags(
        q,
        None,
        "Spark master URL (default: --conf spark.master, spark-defaults.conf, else local[4])",
    )
    q.add_argument(
        "--deploy-mode",
        default="client",
        choices=("client", "cluster"),
        help="only client: this command is the driver",
    )
    q.add_argument(
        "--progress",
        default="auto",
        choices=("auto", "live", "lines", "json"),
        help="live: a live view (rich) on the terminal; lines: one line per batch on stderr; "
        "json: one Structured-Streaming-style progress JSON per batch on stdout; "
        "auto (default): live on a terminal, else lines",
    )
    q.add_argument(
        "--check",
        action="store_true",
        help="check the arguments and print what would run, without starting Spark",
    )
    q.set_defaults(command_module="ingest")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``spark-receivers`` command; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error already printed
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    level = os.environ.get("SPARK_RECEIVERS_LOG_LEVEL", "WARNING").upper()
    if level not in logging.getLevelNamesMapping():
        print(
            "error: SPARK_RECEIVERS_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR, "
            f"got {level!r}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command_module == "demo":
            from spark_receivers.cli.demo import run as run_demo

            return run_demo(args)
        from spark_receivers.cli.ingest import run as run_ingest

        return run_ingest(args)
    except ConfigError as e:
        _error(e)
        return EXIT_USAGE
    except SparkReceiversError as e:
        _error(e)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _error(e: BaseException) -> None:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
