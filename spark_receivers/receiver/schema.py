"""Records ↔ Arrow: the receiver's declared schema and the checks that name bad records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from spark_receivers.errors import ReceiverError

DEFAULT_SCHEMA = pa.schema([pa.field("value", pa.string())])
"""One string column ``value``: the schema of a receiver that declares none."""


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
