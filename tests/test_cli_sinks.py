"""Sinks of ``ingest``: parsed and checked without Spark; table and format writers on Spark."""

from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_receivers.cli.sinks import SinkSpec, parse_sink
from spark_receivers.cli.table_sink import open_table
from spark_receivers.errors import ConfigError

VALUE_SCHEMA = pa.schema([pa.field("value", pa.string())])


def test_parse_each_kind(tmp_path):
    assert parse_sink("console") == SinkSpec("console")
    assert parse_sink(f"parquet:{tmp_path}/out") == SinkSpec("parquet", f"{tmp_path}/out")
    assert parse_sink("parquet:s3a://bucket/out").target == "s3a://bucket/out"
    assert parse_sink("table:events") == SinkSpec("table", "events")
    assert parse_sink("table:db.events", [f"path={tmp_path}"]).options == (("path", str(tmp_path)),)
    spec = parse_sink("format:json", ["path=/o/b={batch_time_ms}", "mode=overwrite"])
    assert spec == SinkSpec(
        "format", "json", (("path", "/o/b={batch_time_ms}"), ("mode", "overwrite"))
    )


def test_relative_parquet_dirs_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_sink("parquet:out").target == str(tmp_path / "out")


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        (
            "nosuch",
            [],
            "unknown sink 'nosuch': use console, parquet:DIR, table:NAME or format:NAME",
        ),
        ("parquet:", [], "unknown sink 'parquet:'"),
        ("kafka:topic", [], "unknown sink 'kafka:topic'"),
        ("console", ["a=b"], "takes no --sink-option a"),
        ("table:1bad", [], "a table name is NAME or DATABASE.NAME"),
        ("table:a.b.c", [], "a table name is NAME or DATABASE.NAME"),
        ("table:t", ["mode=append"], "takes no --sink-option mode"),
        ("format:json", ["mode=sometimes"], "mode must be one of append, overwrite"),
        ("format:json", ["path=/x/{batch}"], "uses {batch}; the only placeholder is"),
        ("format:json", ["path=/x/{"], "--sink-option path: .* in '/x/{'"),
        ("format:json", ["novalue"], "--sink-option must be KEY=VALUE"),
        ("format:json", ["a=1", "a=2"], "--sink-option a is given twice"),
        ("format:not a name", [], "is not a data source name"),
    ],
)
def test_bad_sinks_fail_clearly(spec, options, message):
    with pytest.raises(ConfigError, match=message):
        parse_sink(spec, options)


def test_a_sink_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        parse_sink(f"parquet:{tmp_path}/f")


def test_display_masks_secret_options():
    spec = parse_sink("format:jdbc", ["url=jdbc:x", "password=s3cret", "dbtable=t"])
    assert spec.display == "format:jdbc (url=jdbc:x, password=***, dbtable=t)"


def _rows(path: str) -> list[str]:
    return sorted(v for f in glob.glob(path) for v in pq.read_table(f).column("value").to_pylist())


@pytest.mark.spark
def test_table_sink_survives_a_lost_catalog_without_duplicates(spark, tmp_path):
    name, location = "cli_restart_events", str(tmp_path / "events")
    said: list[str] = []
    write = open_table(spark, name, location, VALUE_SCHEMA, said.append)
    assert said == [f"table {name}: 0 batch partition(s) from earlier runs"]
    df = spark.createDataFrame([("a",), ("b",)], "value string")
    write(df, 1000)
    write(spark.createDataFrame([("c",)], "value string"), 2000)
    write(df, 1000)  # the same batch run again (a recovered run): replaced, not appended
    assert sorted(r.value for r in spark.table(name).collect()) == ["a", "b", "c"]
    # A new process has a new in-memory catalog: the table is gone, its files are not.
    spark.sql(f"DROP TABLE {name}")  # external: only the catalog entry goes
    assert os.path.isdir(os.path.join(location, "batch_time_ms=1000"))
    write = open_table(spark, name, location, VALUE_SCHEMA, said.append)
    assert said[-1] == f"table {name}: 2 batch partition(s) from earlier runs"
    write(df, 1000)
    write(spark.createDataFrame([("d",)], "value string"), 3000)
    rows = spark.table(name).orderBy("batch_time_ms", "value").collect()
    assert [(r.value, r.batch_time_ms) for r in rows] == [
        ("a", 1000),
        ("b", 1000),
        ("c", 2000),
        ("d", 3000),
    ]
    assert _rows(os.path.join(location, "batch_time_ms=1000", "*.parquet")) == ["a", "b"]
    spark.sql(f"DROP TABLE {name}")


@pytest.mark.spark
def test_table_sink_refuses_a_table_of_other_columns(spark, tmp_path):
    spark.sql(f"CREATE TABLE cli_other (n INT) USING parquet LOCATION '{tmp_path}/other'")
    try:
        with pytest.raises(ConfigError, match="the table exists with columns"):
            open_table(spark, "cli_other", None, VALUE_SCHEMA)
    finally:
        spark.sql("DROP TABLE cli_other")


@pytest.mark.spark
def test_format_sink_with_a_batch_path_is_idempotent(spark, tmp_path):
    out = tmp_path / "json"
    spec = parse_sink("format:json", [f"path={out}/b={{batch_time_ms}}", "mode=overwrite"])
    write = spec.open(spark, VALUE_SCHEMA)
    df = spark.createDataFrame([("x",), ("y",)], "value string")
    write(df, 5000)
    write(df, 5000)  # run again: overwritten
    write(spark.createDataFrame([("z",)], "value string"), 6000)
    assert sorted(os.listdir(out)) == ["b=5000", "b=6000"]
    assert spark.read.json(str(out / "b=5000")).count() == 2


@pytest.mark.spark
def test_format_sink_append_with_partition_by(spark, tmp_path):
    out = tmp_path / "parquet"
    spec = parse_sink("format:parquet", [f"path={out}", "partitionBy=kind"])
    write = spec.open(spark, VALUE_SCHEMA)
    write(spark.createDataFrame([("x", "a"), ("y", "b")], "value string, kind string"), 1)
    write(spark.createDataFrame([("z", "a")], "value string, kind string"), 2)
    assert sorted(d for d in os.listdir(out) if d.startswith("kind=")) == ["kind=a", "kind=b"]
    assert _rows(f"{out}/kind=a/*.parquet") == ["x", "z"]  # appended


@pytest.mark.spark
def test_an_unknown_format_is_refused_before_any_batch(spark):
    with pytest.raises(ConfigError, match="Spark has no data source 'delta'"):
        parse_sink("format:delta", ["path=/tmp/x"]).open(spark, VALUE_SCHEMA)
