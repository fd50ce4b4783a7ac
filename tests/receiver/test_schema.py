"""Receiver schemas as Spark users write them (pyarrow.Schema, StructType, DDL), checked at once."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle
from pyspark.sql import types as T

from spark_receivers import ConfigError, Receiver, as_arrow_schema
from spark_receivers.receiver.ddl import parse_ddl
from spark_receivers.receiver.schema import DEFAULT_SCHEMA


class Quiet(Receiver):
    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass


EVENTS = pa.schema(
    [
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
    ]
)


def test_the_three_forms_give_the_same_arrow_schema():
    struct = T.StructType(
        [
            T.StructField("ts", T.TimestampType()),
            T.StructField("key", T.StringType(), nullable=False),
            T.StructField("value", T.DoubleType()),
        ]
    )
    assert as_arrow_schema(EVENTS) is EVENTS
    assert as_arrow_schema(struct) == EVENTS
    assert as_arrow_schema("ts timestamp, key string not null, value double") == EVENTS
    assert Quiet(schema="ts TIMESTAMP, key STRING NOT NULL, value DOUBLE").schema == EVENTS
    assert Quiet(schema=struct).schema == EVENTS
    assert Quiet().schema is DEFAULT_SCHEMA


def test_ddl_types_map_as_spark_maps_them_to_arrow():
    schema = as_arrow_schema(
        "a tinyint, b smallint, c int, d bigint, e float, f double, g decimal(12, 3), "
        "h string, i char(3), j varchar(9), k binary, l boolean, m date, n timestamp, "
        "o timestamp_ntz, p array<int>, q map<string, bigint>, r struct<x: int, y string>"
    )
    assert [f.type for f in schema] == [
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.float32(),
        pa.float64(),
        pa.decimal128(12, 3),
        pa.string(),
        pa.string(),  # char/varchar are strings in a DataFrame
        pa.string(),
        pa.binary(),
        pa.bool_(),
        pa.date32(),
        pa.timestamp("us", tz="UTC"),
        pa.timestamp("us"),
        pa.list_(pa.int32()),
        pa.map_(pa.string(), pa.int64()),
        pa.struct([("x", pa.int32()), ("y", pa.string())]),
    ]


def test_ddl_comments_and_quoted_names_are_kept():
    schema = as_arrow_schema("`event time` timestamp COMMENT 'when, in UTC', `a``b` int")
    assert schema.names == ["event time", "a`b"]
    assert parse_ddl("x int comment 'it\\'s'").fields[0].metadata == {"comment": "it's"}


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("int", r"a field needs a name and a type \(write 'value int'\) at position 0"),
        ("ts timestamp,", "expected a field name, found the end at position 13"),
        ("ts timestmp", "unknown type 'timestmp' at position 3"),
        ("a array<int", "expected '>', found the end"),
        ("a int b int", "expected ',' or the end of the schema, found 'b' at position 6"),
        ("a decimal(40, 2)", r"decimal\(40, 2\) needs 1 <= precision <= 38"),
        ("a interval day", "type interval is not supported"),
        ("a string collate unicode", "collated strings are not supported"),
        ("a int; drop table x", "unexpected character ';' at position 5"),
        ("", "expected a field, found the end at position 0"),
        ("s struct<>", None),  # valid DDL, but see below: an empty struct is fine inside
    ],
)
def test_bad_ddl_is_a_config_error_at_construction(ddl, message):
    if message is None:
        assert Quiet(schema=ddl).schema.names == ["s"]
        return
    with pytest.raises(ConfigError, match=message) as info:
        Quiet(schema=ddl)
    assert str(info.value).startswith(f"Quiet(schema=...): {ddl!r} is not a valid DDL schema")


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (pa.schema([("n", pa.uint32())]), "field 'n' has the Arrow type uint32, which Spark"),
        (pa.schema([]), "has no field"),
        ("a int, a string", r"has the field name 'a' twice: \['a', 'a'\]"),
        (T.StructType([]), "has no field"),
        (42, "must be a pyarrow.Schema, a pyspark StructType or a DDL string.*got int 42"),
        (T.StringType(), "got StringType"),
        (["value"], "got list"),
    ],
)
def test_a_schema_spark_cannot_read_is_refused_naming_the_receiver(schema, message):
    with pytest.raises(ConfigError, match=message) as info:
        Quiet(schema=schema)
    assert str(info.value).startswith("Quiet(schema=...)")


def test_a_class_attribute_schema_is_converted_when_the_class_is_made():
    class Events(Quiet):
        schema = "ts timestamp, key string not null, value double"

    assert Events.schema == EVENTS
    assert Events().schema == EVENTS
    assert Events(schema="x int").schema.names == ["x"]  # an argument still wins

    with pytest.raises(ConfigError, match=r"Broken.schema.*unknown type 'strin'"):

        class Broken(Quiet):
            schema = "key strin"


def test_a_property_schema_is_left_alone():
    class Computed(Quiet):
        @property
        def schema(self):  # type: ignore[override]
            return EVENTS

    assert Computed().schema is EVENTS


def test_the_executor_gets_the_arrow_schema_only():
    receiver = Quiet(schema="ts timestamp, key string not null, value double")
    for dumps, loads in ((cloudpickle.dumps, pickle.loads), (pickle.dumps, pickle.loads)):
        copy = loads(dumps(receiver))
        assert isinstance(copy.schema, pa.Schema) and copy.schema == EVENTS


# --- the DDL parser against Spark's own -------------------------------------------------

PRIMITIVES = [
    "boolean",
    "tinyint",
    "byte",
    "smallint",
    "short",
    "int",
    "integer",
    "bigint",
    "long",
    "float",
    "real",
    "double",
    "string",
    "binary",
    "date",
    "timestamp",
    "timestamp_ntz",
    "timestamp_ltz",
    "decimal",
    "decimal(7)",
    "dec(20, 4)",
    "numeric(38,38)",
    "char(4)",
    "varchar(30)",
]
names = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True) | st.from_regex(
    r"[a-z ,.:<>]{1,8}", fullmatch=True
).map(lambda s: f"`{s}`")


def types(depth: int = 2) -> st.SearchStrategy[str]:
    base = st.sampled_from(PRIMITIVES).flatmap(lambda t: st.sampled_from([t, t.upper(), t.title()]))
    if depth == 0:
        return base
    inner = types(depth - 1)
    return st.one_of(
        base,
        inner.map(lambda t: f"array<{t}>"),
        st.tuples(base, inner).map(lambda kv: f"map<{kv[0]}, {kv[1]}>"),
        st.lists(field(inner, ":"), min_size=1, max_size=3).map(
            lambda fs: f"struct<{','.join(fs)}>"
        ),
    )


def field(type_strategy: st.SearchStrategy[str], sep: str = " ") -> st.SearchStrategy[str]:
    suffix = st.sampled_from(["", " NOT NULL", " not null", " COMMENT 'a, b'", ' comment "c"'])
    return st.tuples(names, type_strategy, suffix).map(lambda p: f"{p[0]}{sep}{p[1]}{p[2]}")


@st.composite
def schemas(draw) -> str:
    fields = draw(st.lists(field(types()), min_size=1, max_size=4))
    return ", ".join(fields)


@pytest.mark.spark
@settings(max_examples=150, deadline=None)
@given(schemas())
def test_parse_ddl_gives_what_spark_gives(spark, ddl):
    assert parse_ddl(ddl) == T.StructType.fromDDL(ddl)
    ours = [f.metadata for f in parse_ddl(ddl).fields]
    assert ours == [f.metadata for f in T.StructType.fromDDL(ddl).fields]


@pytest.mark.spark
def test_a_ddl_schema_round_trips_through_spark_to_the_same_arrow(spark):
    """The reader maps the receiver's Arrow schema to Spark's and back: nothing changes."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from spark_receivers.spark.block_source import arrow_schema_of

    ddl = "ts timestamp, n timestamp_ntz, d decimal(9,2), a array<struct<k: string, v: int>>"
    arrow = as_arrow_schema(ddl)
    assert from_arrow_schema(arrow) == T.StructType.fromDDL(ddl)
    assert arrow_schema_of(from_arrow_schema(arrow)) == arrow
