"""Records ↔ Arrow: the receiver's declared schema and the checks that name bad records.

A receiver declares its schema as a ``pyarrow.Schema``, a PySpark ``StructType``
or a DDL string (``"ts timestamp, v string"``); :func:`as_arrow_schema` turns
any of them into the Arrow schema the executor works with, once, on the driver
(``Receiver.__init__``, a class attribute at class creation), and checks that
Spark can read it. The executor only ever sees the Arrow schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa
from pyspark.sql.types import StructType

from spark_receivers.errors import ConfigError, ReceiverError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

DEFAULT_SCHEMA = pa.schema([pa.field("value", pa.string())])
"""One string column ``value``: the schema of a receiver that declares none."""

SchemaLike: TypeAlias = pa.Schema | StructType | str
"""What ``Receiver(schema=...)`` takes: an Arrow schema, a ``StructType`` or a DDL string."""

SPARK_TIMEZONE = "UTC"
"""Spark ``timestamp`` (TIMESTAMP_LTZ) columns become Arrow ``timestamp[us, tz=UTC]``."""


def as_arrow_schema(schema: Any, what: str = "schema") -> pa.Schema:
    """The Arrow schema of ``schema``: a ``pyarrow.Schema``, a ``StructType`` or DDL.

    ``StructType`` and DDL fields map as Spark maps them to Arrow (``timestamp``
    → ``timestamp[us, tz=UTC]``, ``timestamp_ntz`` → ``timestamp[us]``,
    ``char``/``varchar`` → ``string``); DDL is parsed without a SparkSession
    (:mod:`spark_receivers.receiver.ddl`). Raises :class:`ConfigError` naming
    ``what`` when ``schema`` is none of these, has no field or a duplicate field
    name, or has a type Spark cannot read. Any thread; no Spark needed.
    """
    if isinstance(schema, pa.Schema):
        arrow = schema
    elif isinstance(schema, str):
        from spark_receivers.receiver.ddl import parse_ddl

        arrow = _from_struct(parse_ddl(schema, what), what)
    elif isinstance(schema, StructType):
        arrow = _from_struct(schema, what)
    else:
        msg = (
            f"{what} must be a pyarrow.Schema, a pyspark StructType or a DDL string "
            f"such as 'ts timestamp, value string'; got {type(schema).__name__} {schema!r:.100}"
        )
        raise ConfigError(msg)
    _check_readable(arrow, what)
    return arrow


def _from_struct(struct: StructType, what: str) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(_chars_as_strings(struct), timezone=SPARK_TIMEZONE)
    except Exception as e:
        msg = f"{what} {struct.simpleString()} has a type Spark cannot exchange as Arrow: {e}"
        raise ConfigError(msg) from e


def _chars_as_strings(dt: DataType) -> Any:
    """``char(n)``/``varchar(n)`` as ``string``, as Spark reads them into a DataFrame."""
    from pyspark.sql import types as t

    if isinstance(dt, t.CharType | t.VarcharType):
        return t.StringType()
    if isinstance(dt, t.StructType):
        fields = [
            t.StructField(f.name, _chars_as_strings(f.dataType), f.nullable, f.metadata)
            for f in dt.fields
        ]
        return t.StructType(fields)
    if isinstance(dt, t.ArrayType):
        return t.ArrayType(_chars_as_strings(dt.elementType), dt.containsNull)
    if isinstance(dt, t.MapType):
        key, value = _chars_as_strings(dt.keyType), _chars_as_strings(dt.valueType)
        return t.MapType(key, value, dt.valueContainsNull)
    return dt


def _check_readable(schema: pa.Schema, what: str) -> None:
    """Refuse what no batch could read: no field, duplicate names, types Spark lacks."""
    if schema is DEFAULT_SCHEMA:
        return
    if len(schema) == 0:
        msg = f"{what} has no field: a receiver schema needs at least one"
        raise ConfigError(msg)
    seen: set[str] = set()
    for name in schema.names:
        if name in seen:
            msg = f"{what} has the field name {name!r} twice: {schema.names}"
            raise ConfigError(msg)
        seen.add(name)
    from pyspark.sql.pandas.types import from_arrow_type

    for field in schema:
        try:
            from_arrow_type(field.type)
        except Exception as e:
            msg = (
                f"{what}: field {field.name!r} has the Arrow type {field.type}, which Spark "
                f"cannot read into a DataFrame ({e}); use a type Spark has (e.g. int64 "
                "for unsigned integers)"
            )
            raise ConfigError(msg) from e


def is_default(schema: pa.Schema) -> bool:
    """True for the one-string-column ``value`` schema."""
    return schema.equals(DEFAULT_SCHEMA)


def check_record(record: Any, schema: pa.Schema) -> None:
    """Raise :class:`ReceiverError` naming the field and value if ``record`` does not fit."""
    if is_default(schema):
        if not isinstance(record, str):
            msg = (
                f"record {record!r:.100} does not fit field 'value' (string): store str "
                "records, or declare a schema on the receiver"
            )
            raise ReceiverError(msg)
        return
    if isinstance(record, Mapping):
        items = [(f, record.get(f.name)) for f in schema]
        extra = set(record) - set(schema.names)
        if extra:
            msg = (
                f"record {record!r:.100} has field(s) {sorted(extra)} "
                f"not in the schema {schema.names}"
            )
            raise ReceiverError(msg)
    elif isinstance(record, Sequence) and not isinstance(record, str | bytes):
        if len(record) != len(schema):
            msg = (
                f"record {record!r:.100} has {len(record)} values; "
                f"the schema has {len(schema)} fields"
            )
            raise ReceiverError(msg)
        items = list(zip(schema, record, strict=True))
    else:
        msg = f"record {record!r:.100} must be a dict or a tuple for schema {schema.names}"
        raise ReceiverError(msg)
    for field, value in items:
        if value is None:
            if not field.nullable:
                msg = f"field {field.name!r} ({field.type}) is not nullable, got None"
                raise ReceiverError(msg)
            continue
        try:
            pa.scalar(value, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            msg = f"field {field.name!r} ({field.type}) cannot hold value {value!r:.100}: {e}"
            raise ReceiverError(msg) from None


def records_to_table(records: list[Any], schema: pa.Schema) -> pa.Table:
    """Convert buffered records to a table of ``schema``, naming the first bad record."""
    try:
        if is_default(schema):
            return pa.Table.from_arrays([pa.array(records, pa.string())], schema=schema)
        mappings = sum(1 for r in records if isinstance(r, Mapping))
        if mappings == len(records) and records:
            return pa.Table.from_pylist(records, schema=schema)
        if mappings:
            names = schema.names
            rows = [
                r if isinstance(r, Mapping) else dict(zip(names, r, strict=True)) for r in records
            ]
            return pa.Table.from_pylist(rows, schema=schema)
        columns: list[Any] = list(zip(*records, strict=True)) if records else [[] for _ in schema]
        arrays = [pa.array(col, f.type) for col, f in zip(columns, schema, strict=True)]
        return pa.Table.from_arrays(arrays, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
        for record in records:
            check_record(record, schema)
        msg = f"records do not fit the schema {schema}: {e}"
        raise ReceiverError(msg) from e


def to_table(data: Any, schema: pa.Schema) -> pa.Table:
    """Turn an Arrow batch/table or a pandas frame into a table of ``schema``."""
    if isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.Table):
        table = data
    else:
        table = pa.Table.from_pandas(data, preserve_index=False)
    if table.schema.equals(schema):
        return table
    if set(table.schema.names) != set(schema.names):
        msg = (
            f"stored data has columns {table.schema.names}; the receiver's schema has "
            f"{schema.names}"
        )
        raise ReceiverError(msg)
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        msg = f"stored data with schema {table.schema} cannot be cast to {schema}: {e}"
        raise ReceiverError(msg) from e


def is_block_data(data: Any) -> bool:
    """True for the forms stored as a block of their own: Arrow or pandas."""
    if isinstance(data, pa.RecordBatch | pa.Table):
        return True
    return type(data).__module__.startswith("pandas") and hasattr(data, "columns")


def is_many(data: Any, schema: pa.Schema) -> bool:
    """True for many records, not one record.

    A list; a tuple under a one-column schema (under another a tuple is one record); any
    other iterable but ``str``, ``bytes`` and ``dict``.
    """
    if isinstance(data, list):
        return True
    if isinstance(data, tuple):
        return len(schema) == 1
    return isinstance(data, Iterable) and not isinstance(data, str | bytes | dict)
