"""``spark-receivers ingest``: a source URI to a sink, as a ready-to-run streaming job.

Sources (one receiver each):

* ``socket://host:port`` — lines from a TCP server (:class:`SocketTextReceiver`)
* ``http://host:port/path`` — POSTed lines (:class:`HttpReceiver`); ``?token=...``
  or ``SPARK_RECEIVERS_HTTP_TOKEN`` sets the bearer token, ``?format=json`` JSON lines
* ``file:///dir`` — lines appended to the files of a directory (:class:`FileTailReceiver`);
  ``?pattern=*.log``
* ``redis://host:port/stream?group=g`` — a Redis stream through a consumer group
  (:class:`RedisStreamReceiver`); ``&field=value``
* ``mqtt://host:port/topic`` — an MQTT topic at QoS 1 (:class:`MqttReceiver`)
* ``generator://?rate=1000`` — generated lines, for trying things out

Sinks: ``parquet:DIR`` (one directory per batch, ``DIR/batch_time_ms=<t>``, overwritten
when a batch is re-run, so re-runs are idempotent), ``console`` (prints each batch),
``table:NAME`` (a Spark table partitioned by ``batch_time_ms``, each batch's partition
overwritten: idempotent too).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from spark_receivers.driver.listener import BatchInfo, StreamingListener
from spark_receivers.errors import ConfigError
from spark_receivers.receiver.receiver import Receiver

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_receivers.context import StreamingContext

SCHEMES = ("socket", "http", "file", "redis", "mqtt", "generator")
Sink = Callable[["DataFrame", int], None]


def parse_duration_ms(text: str) -> int:
    """``1s``, ``500ms``, ``2m`` or a bare number of milliseconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*", text)
    if not m:
        msg = f"--batch-interval must look like 1s, 500ms or 2m, got {text!r}"
        raise ConfigError(msg)
    scale = {"ms": 1, "s": 1000, "m": 60_000}[m.group(2) or "ms"]
    value = int(float(m.group(1)) * scale)
    if value <= 0:
        msg = f"--batch-interval must be > 0, got {text!r}"
        raise ConfigError(msg)
    return value


def receiver_for(uri: str) -> Receiver:
    """The receiver a source URI names; a clear error for anything else."""
    u = urlparse(uri)
    query = {k: v[-1] for k, v in parse_qs(u.query).items()}
    host = u.hostname or "127.0.0.1"
    try:
        port = u.port
    except ValueError:
        port = None
    if u.scheme == "socket":
        if port is None:
            msg = f"source {uri!r} needs a port: socket://host:port"
            raise ConfigError(msg)
        from spark_receivers.receivers.socket_text import SocketTextReceiver

        return SocketTextReceiver(host, port)
    if u.scheme == "http":
        from spark_receivers.receivers.http import HttpReceiver

        token = query.get("token") or os.environ.get("SPARK_RECEIVERS_HTTP_TOKEN")
        return HttpReceiver(
            host,
            port or 8080,
            path=u.path or "/ingest",
            token=token,
            format=query.get("format", "lines"),
        )
    if u.scheme == "file":
        from spark_receivers.receivers.file_tail import FileTailReceiver

        if not u.path:
            msg = f"source {uri!r} needs a directory: file:///path/to/dir"
            raise ConfigError(msg)
        return FileTailReceiver(u.path, pattern=query.get("pattern", "*"))
    if u.scheme == "redis":
        from spark_receivers.receivers.redis_stream import RedisStreamReceiver

        stream = u.path.lstrip("/")
        if not stream or "group" not in query:
            msg = f"source {uri!r} needs a stream and a group: redis://host:port/stream?group=g"
            raise ConfigError(msg)
        field = query.get("field", "value")
        return RedisStreamReceiver(
            stream, query["group"], url=f"redis://{host}:{port or 6379}/0", field=field or None
        )
    if u.scheme == "mqtt":
        from spark_receivers.receivers.mqtt import MqttReceiver

        topic = u.path.lstrip("/")
        if not topic:
            msg = f"source {uri!r} needs a topic: mqtt://host:port/topic"
            raise ConfigError(msg)
        return MqttReceiver(host, port or 1883, topic=topic)
    if u.scheme == "generator":
        from spark_receivers.receivers.generator import GeneratorReceiver

        rate = float(query.get("rate", "1000"))
        return GeneratorReceiver(rate=rate)
    msg = f"unknown source {uri!r}: the scheme must be one of {', '.join(SCHEMES)}"
    raise ConfigError(msg)


def sink_for(spec: str, spark: SparkSession) -> Sink:
    """The output operation a sink spec names."""
    from pyspark.sql import functions as F

    if spec == "console":

        def console(df: DataFrame, batch_time_ms: int) -> None:
            when = time.strftime("%H:%M:%S", time.localtime(batch_time_ms / 1000))
            print(f"--- batch {when} ({batch_time_ms}) ---", flush=True)
            df.show(20, truncate=False)

        return console
    kind, _, target = spec.partition(":")
    if kind == "parquet" and target:

        def parquet(df: DataFrame, batch_time_ms: int) -> None:
            df.write.mode("overwrite").parquet(
                os.path.join(target, f"batch_time_ms={batch_time_ms}")
            )

        return parquet
    if kind == "table" and target:
        spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")

        def table(df: DataFrame, batch_time_ms: int) -> None:
            out = df.withColumn("batch_time_ms", F.lit(batch_time_ms))
            if spark.catalog.tableExists(target):
                out.write.insertInto(target, overwrite=True)
            else:
                out.write.partitionBy("batch_time_ms").saveAsTable(target)

        return table
    msg = f"unknown sink {spec!r}: use parquet:DIR, console or table:NAME"
    raise ConfigError(msg)


class ProgressPrinter(StreamingListener):
    """Prints one line per completed batch (and receiver changes) to a stream."""

    def __init__(self, ssc: StreamingContext, out: Any = None) -> None:
        self._ssc = ssc
        self._out = out or sys.stderr
        self.batches = 0
        self.records = 0

    def _say(self, text: str) -> None:
        print(text, file=self._out, flush=True)

    def on_batch_completed(self, info: BatchInfo) -> None:
        """One line: batch, input, rate, processing time, delay, receivers."""
        self.batches += 1
        self.records += info.num_records
        interval_s = self._ssc.batch_interval_ms / 1000.0
        states = " ".join(f"{r.stream_id}={r.state}" for r in self._ssc.status().receivers)
        when = time.strftime("%H:%M:%S", time.localtime(info.batch_time_ms / 1000))
        failed = any(o.failure_reason for o in info.output_operations.values())
        rate = info.num_records / interval_s
        processing, delay = info.processing_delay_ms or 0, info.scheduling_delay_ms or 0
        self._say(
            f"batch {when}  in {info.num_records:>9,} ({rate:>10,.0f}/s)  "
            f"proc {processing:>6} ms  delay {delay:>6} ms  "
            f"receivers {states}{'  FAILED' if failed else ''}"
        )

    def on_receiver_error(self, info: Any) -> None:
        """A receiver reported an error."""
        self._say(f"receiver {info.stream_id} ({info.name}): {info.last_error_message}")
