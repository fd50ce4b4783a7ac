"""StreamGraph: unions of streams (Spark's ssc.union) and schemas resolved on the driver."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_receivers import ConfigError, Receiver, StateError, UnionStream
from spark_receivers.driver.batches.stream_graph import StreamGraph
from spark_receivers.receiver.schema import DEFAULT_SCHEMA


class Quiet(Receiver):
    """A receiver that is never started here: only its schema matters."""

    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass


def graph() -> StreamGraph:
    return StreamGraph(spark=None)  # type: ignore[arg-type]  # no Spark needed to build


def test_union_of_receiver_streams_with_the_same_fields():
    g = graph()
    a = g.receiver_stream(Quiet(schema="ts timestamp, v string"))
    b = g.receiver_stream(Quiet(schema="v string, ts timestamp"))  # order does not matter
    u = g.union([a, b])
    assert isinstance(u, UnionStream)
    assert u.streams == (a, b)
    assert u.arrow_schema == a.arrow_schema
    assert a.union(b).streams == (a, b)  # the stream method is the same union


def test_union_refuses_different_field_names_naming_both_streams():
    g = graph()
    a = g.receiver_stream(Quiet())
    b = g.receiver_stream(Quiet(schema="ts timestamp, value string"))
    with pytest.raises(ConfigError, match=r"stream 1 \(Quiet-1\).*\['ts'\] extra.*stream 0"):
        g.union([a, b])


def test_union_refuses_a_field_of_another_spark_type():
    g = graph()
    a = g.receiver_stream(Quiet(schema="n bigint"))
    b = g.receiver_stream(Quiet(schema="n int"))
    with pytest.raises(ConfigError, match="field 'n' is int in one and bigint in the other"):
        g.union([a, b])


def test_union_compares_spark_types_not_arrow_encodings():
    g = graph()
    ms = g.receiver_stream(Quiet(schema=pa.schema([("t", pa.timestamp("ms", tz="UTC"))])))
    us = g.receiver_stream(Quiet(schema="t timestamp"))  # timestamp[us, tz=UTC]
    nullable = g.receiver_stream(Quiet(schema="t timestamp not null"))
    assert g.union([ms, us, nullable]).streams == (ms, us, nullable)


def test_union_of_a_transformed_stream_is_checked_when_its_batch_runs():
    g = graph()
    a = g.receiver_stream(Quiet())
    t = g.receiver_stream(Quiet(schema="x int")).transform(lambda df: df)
    u = g.union([a, t])  # the transform's schema is unknown until a batch runs
    assert u.arrow_schema is None


@pytest.mark.parametrize(
    ("streams", "message"),
    [
        ([], "at least one stream"),
        (["not a stream"], "takes streams of this context, got str"),
    ],
)
def test_union_refuses_what_is_not_a_stream(streams, message):
    with pytest.raises(ConfigError, match=message):
        graph().union(streams)


def test_union_refuses_structured_streams_and_streams_of_another_context():
    g, other = graph(), graph()
    structured = g.structured_stream(Quiet())
    with pytest.raises(ConfigError, match=r"cannot union structured stream 0.*unionByName"):
        g.union([structured])
    foreign = other.receiver_stream(Quiet())
    with pytest.raises(ConfigError, match="belongs to another streaming context"):
        g.union([foreign])


def test_no_union_once_the_graph_is_frozen():
    g = graph()
    a = g.receiver_stream(Quiet())
    g.freeze("ACTIVE", reader=lambda s, t, b: None, source_options=lambda i: {})  # type: ignore
    with pytest.raises(StateError, match=r"cannot make a union of streams: .* ACTIVE"):
        g.union([a])


def test_a_schema_set_after_init_is_converted_when_the_stream_is_added():
    receiver = Quiet()
    receiver.schema = "k string, n bigint"  # type: ignore[assignment]  # the untyped way
    graph().receiver_stream(receiver)
    assert receiver.schema == pa.schema([("k", pa.string()), ("n", pa.int64())])
    bad = Quiet()
    bad.schema = 42  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"Quiet.schema must be a pyarrow.Schema.*got int 42"):
        graph().receiver_stream(bad)


def test_forgetting_a_batch_reaches_every_stream_of_a_union():
    g = graph()
    a, b = g.receiver_stream(Quiet()), g.receiver_stream(Quiet())
    u = g.union([a, b])
    u.foreach_batch(lambda df, t: None)
    for s in (a, b):
        s._set_batch(1000, object())  # type: ignore[arg-type]
    u._cache[1000] = object()  # type: ignore[assignment]
    g.forget(1000)
    assert a._cache == b._cache == u._cache == {}


@pytest.mark.spark
def test_each_union_batch_holds_every_streams_rows_by_column_name(spark):
    """The graph on real DataFrames: a union of three streams, one of them transformed."""
    g = StreamGraph(spark)
    a = g.receiver_stream(Quiet(schema="k string, n bigint"))
    b = g.receiver_stream(Quiet(schema="n bigint, k string"))
    c = g.receiver_stream(Quiet())
    renamed = c.transform(lambda df: df.selectExpr("value AS k", "length(value) AS n"))
    seen: dict[int, list[tuple[str, int]]] = {}
    g.union([a, b, renamed]).foreach_batch(
        lambda df, t: seen.__setitem__(t, sorted((r.k, r.n) for r in df.collect()))
    )
    mismatched = g.union([a, c.transform(lambda df: df)])
    mismatched.foreach_batch(lambda df, t: None)
    rows = {
        0: [{"k": "a", "n": 1}],
        1: [{"n": 2, "k": "b"}, {"n": 3, "k": "bb"}],
        2: [{"value": "ccc"}],
    }

    def reader(stream, batch_time_ms, blocks):
        schema = pa.schema(stream.receiver.schema)
        table = pa.Table.from_pylist(rows[stream.stream_id], schema=schema)
        return spark.createDataFrame(table.to_pandas())

    g.freeze("ACTIVE", reader, lambda i: {})
    union_op, mismatch_op = g.generate_jobs(1000, {})
    union_op.run()
    assert seen[1000] == [("a", 1), ("b", 2), ("bb", 3), ("ccc", 3)]
    with pytest.raises(ConfigError, match=r"cannot union the batch 1000 of a transformed stream"):
        mismatch_op.run()
    assert DEFAULT_SCHEMA.equals(c.arrow_schema)


def test_foreach_batch_passes_a_batch_id_to_a_function_of_three_parameters():
    g = StreamGraph(spark=None, batch_interval_ms=1000)  # type: ignore[arg-type]
    s = g.receiver_stream(Quiet())
    seen: list[tuple] = []

    def with_id(df, batch_time_ms, batch_id):
        seen.append(("three", batch_time_ms, batch_id))

    class Sink:
        def __call__(self, *args):
            seen.append(("explicit", *args[1:]))

    s.foreach_batch(lambda df, t: seen.append(("two", t)))  # the form of old
    s.foreach_batch(with_id)
    s.foreach_batch(Sink(), with_batch_id=True)  # *args: said explicitly
    s.foreach_batch(
        lambda df, t, extra=None: seen.append(("two again", t, extra)), with_batch_id=False
    )
    g.freeze("ACTIVE", lambda stream, t, blocks: object(), lambda i: {})
    for op in g.generate_jobs(5000, {}):
        op.run()
    assert seen == [
        ("two", 5000),
        ("three", 5000, 5),
        ("explicit", 5000, 5),
        ("two again", 5000, None),
    ]


def test_foreach_batch_refuses_a_with_batch_id_that_is_not_a_bool():
    s = graph().receiver_stream(Quiet())
    with pytest.raises(ConfigError, match="with_batch_id"):
        s.foreach_batch(lambda df, t: None, with_batch_id="yes")  # type: ignore[arg-type]
