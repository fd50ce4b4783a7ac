"""``--sink`` specs: where ``ingest`` writes every batch, idempotently where it can.

* ``console``: prints each batch (``df.show``).
* ``parquet:DIR``: one directory per batch, ``DIR/batch_time_ms=<t>``, overwritten
  when a batch runs again (a recovered run re-runs the batches a crash left
  unfinished with the same records), so re-runs never duplicate. ``--sink-option``
  values are Parquet writer options (``compression=zstd``).
* ``table:NAME``: a Spark table partitioned by ``batch_time_ms``, stored as Parquet
  at ``LOCATION`` (``--sink-option path=DIR``; default ``<spark.sql.warehouse.dir>/NAME``).
  The table is *external*: at every start it is registered again over its location
  (``CREATE TABLE IF NOT EXISTS ... LOCATION``, then ``RECOVER PARTITIONS``), so
  Spark's default in-memory catalog, which forgets it when the process ends, is
  enough: a restarted or re-run job sees every batch written before. Each batch
  replaces only its own partition (``INSERT OVERWRITE ... PARTITION
  (batch_time_ms=<t>)``), so a re-run batch is never written twice. With a Hive
  metastore the table already exists and is used as it is.
* ``format:NAME``: ``df.write.format(NAME)`` with ``--sink-option k=v`` as writer
  options; ``mode`` (default ``append``) and ``partitionBy`` (comma-separated) are
  the writer's settings. ``{batch_time_ms}`` in a value is replaced by the batch
  time, which makes idempotent writes possible: ``path=/out/b={batch_time_ms}``
  with ``mode=overwrite``, or Delta's ``txnAppId=<job>`` +
  ``txnVersion={batch_time_ms}`` (a re-run batch is skipped by Delta).

Everything but the format's presence in Spark is checked before Spark starts.
"""

from __future__ import annotations

import os
import re
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_receivers.cli.uri import MASK
from spark_receivers.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SINK_KINDS", "Sink", "SinkSpec", "parse_sink"]

Sink = Callable[["DataFrame", int], None]
SINK_KINDS = "console, parquet:DIR, table:NAME or format:NAME"
WRITE_MODES = ("append", "overwrite", "ignore", "error", "errorifexists")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FORMAT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
_SECRET_KEY = re.compile(r"pass|secret|token|credential|jaas|auth|(^|[._])key$", re.IGNORECASE)


@dataclass(frozen=True)
class SinkSpec:
    """A parsed ``--sink`` with its ``--sink-option`` items; :meth:`open` makes the writer."""

    kind: str
    """``console``, ``parquet``, ``table`` or ``format``."""
    target: str = ""
    """The directory, table name or format name."""
    options: tuple[tuple[str, str], ...] = ()

    @property
    def display(self) -> str:
        """The sink as the user wrote it, option values that look secret masked."""
        head = self.kind if not self.target else f"{self.kind}:{self.target}"
        shown = [f"{k}={MASK if _SECRET_KEY.search(k) else v}" for k, v in self.options]
        return head + (f" ({', '.join(shown)})" if shown else "")

    def open(
        self, spark: SparkSession, schema: pa.Schema, say: Callable[[str], None] = print
    ) -> Sink:
        """The output operation, once Spark runs (``schema``: the receiver's records).

        ``say`` prints what the user should know (a table's earlier partitions).
        May raise :class:`ConfigError` (an unknown format, a table of another schema).
        Runs on the caller's thread; the returned function runs on batch threads.
        """
        if self.kind == "console":
            return _console
        if self.kind == "parquet":
            return _parquet(self.target, dict(self.options))
        if self.kind == "table":
            from spark_receivers.cli.table_sink import open_table

            return open_table(spark, self.target, dict(self.options).get("path"), schema, say)
        return _format(spark, self.target, dict(self.options))


def parse_sink(spec: str, options: list[str] | None = None) -> SinkSpec:
    """The :class:`SinkSpec` for ``--sink spec`` and ``--sink-option k=v`` items."""
    opts = _options(options or [])
    kind, colon, target = spec.strip().partition(":")
    if kind == "console" and not colon:
        _only(spec, opts, ())
        return SinkSpec("console")
    if not colon or kind not in ("parquet", "table", "format") or not target:
        msg = f"unknown sink {spec!r}: use {SINK_KINDS}"
        raise ConfigError(msg)
    if kind == "parquet":
        return SinkSpec("parquet", _local_dir(spec, target), tuple(opts.items()))
    if kind == "table":
        parts = target.split(".")
        if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(p) for p in parts):
            msg = f"sink {spec!r}: a table name is NAME or DATABASE.NAME (letters, digits, _)"
            raise ConfigError(msg)
        _only(spec, opts, ("path",))
        if "path" in opts:
            opts["path"] = _local_dir(spec, opts["path"])
        return SinkSpec("table", target, tuple(opts.items()))
    if not _FORMAT_NAME.fullmatch(target):
        msg = f"sink {spec!r}: {target!r} is not a data source name (json, parquet, delta, ...)"
        raise ConfigError(msg)
    mode = opts.get("mode", "append")
    if mode not in WRITE_MODES:
        msg = f"sink {spec!r}: mode must be one of {', '.join(WRITE_MODES)}, got {mode!r}"
        raise ConfigError(msg)
    for key, value in opts.items():
        _check_template(spec, key, value)
    return SinkSpec("format", target, tuple(opts.items()))


def _options(items: list[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            msg = f"--sink-option must be KEY=VALUE, got {item!r}"
            raise ConfigError(msg)
        if key in opts:
            msg = f"--sink-option {key} is given twice"
            raise ConfigError(msg)
        opts[key] = value
    return opts


def _only(spec: str, opts: dict[str, str], allowed: tuple[str, ...]) -> None:
    extra = sorted(set(opts) - set(allowed))
    if extra:
        takes = f"only {', '.join(allowed)}" if allowed else "none"
        msg = f"sink {spec!r} takes no --sink-option {', '.join(extra)} (it takes {takes})"
        raise ConfigError(msg)


def _local_dir(spec: str, path: str) -> str:
    """A local path made absolute and checked; a URI (``s3a://``, ``hdfs://``) as it is."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) and not path.startswith("file://"):
        return path
    local = os.path.abspath(path.removeprefix("file://"))
    if os.path.exists(local) and not os.path.isdir(local):
        msg = f"sink {spec!r}: {local} exists and is not a directory"
        raise ConfigError(msg)
    return local


def _check_template(spec: str, key: str, value: str) -> None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError as e:
        msg = (
            f"sink {spec!r}: --sink-option {key}: {e} in {value!r} (write {{{{ and }}}} for braces)"
        )
        raise ConfigError(msg) from None
    unknown = sorted(set(fields) - {"batch_time_ms"})
    if unknown:
        msg = (
            f"sink {spec!r}: --sink-option {key} uses {{{unknown[0]}}}; the only placeholder "
            "is {batch_time_ms} (write {{ and }} for braces)"
        )
        raise ConfigError(msg)
    try:
        value.format(batch_time_ms=0)
    except (ValueError, IndexError, KeyError) as e:
        msg = f"sink {spec!r}: --sink-option {key}: bad placeholder in {value!r} ({e})"
        raise ConfigError(msg) from None


# --- the writers (batch threads) ----------------------------------------------------


def _console(df: DataFrame, batch_time_ms: int) -> None:
    when = time.strftime("%H:%M:%S", time.localtime(batch_time_ms / 1000))
    print(f"--- batch {when} ({batch_time_ms}) ---", flush=True)
    df.show(20, truncate=False)


def _parquet(directory: str, options: dict[str, str]) -> Sink:
    def parquet(df: DataFrame, batch_time_ms: int) -> None:
        path = f"{directory.rstrip('/')}/batch_time_ms={batch_time_ms}"
        df.write.mode("overwrite").options(**options).parquet(path)

    return parquet


def _format(spark: SparkSession, name: str, options: dict[str, str]) -> Sink:
    check_format(spark, name)
    mode = options.pop("mode", "append")
    partition_by = [c.strip() for c in options.pop("partitionBy", "").split(",") if c.strip()]

    def write(df: DataFrame, batch_time_ms: int) -> None:
        writer = df.write.format(name).mode(mode)
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        opts = {k: v.format(batch_time_ms=batch_time_ms) for k, v in options.items()}
        writer.options(**opts).save()

    write.__name__ = f"format:{name}"
    return write


def check_format(spark: SparkSession, name: str) -> None:
    """Refuse a data source name this Spark cannot find (before any batch runs)."""
    try:
        jspark: Any = spark._jsparkSession  # type: ignore[attr-defined]
        jvm: Any = spark.sparkContext._jvm
    except Exception:  # noqa: BLE001 - no JVM at hand (Spark Connect): the first batch tells
        return
    if jspark.sessionState().dataSourceManager().dataSourceExists(name):
        return  # a Python data source registered in this session
    try:
        jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
            name, jspark.sessionState().conf()
        )
    except Exception as e:  # py4j wraps Spark's DATA_SOURCE_NOT_FOUND
        msg = (
            f"sink format:{name}: Spark has no data source {name!r}; add its package "
            "(--conf spark.jars.packages=GROUP:ARTIFACT:VERSION, e.g. io.delta:delta-spark_2.13 "
            "for delta) or check the name"
        )
        raise ConfigError(msg) from e
