"""Typing checks of the schema, union and status API, run by ``make lint`` (mypy
--warn-unused-ignores).

Each ``# type: ignore[...]`` marks a line mypy must refuse (see config_fields.py).
"""

from typing import assert_type

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

from spark_receivers import (
    DataFrameStream,
    Receiver,
    ReceiverMetricsInfo,
    ReceiverStatus,
    StreamingContext,
    StreamingStatus,
    UnionStream,
    as_arrow_schema,
)

assert_type(as_arrow_schema("ts timestamp, v string"), pa.Schema)
ddl = Receiver(schema="ts timestamp, v string")
struct = Receiver(schema=StructType([StructField("n", LongType())]))
arrow = Receiver(schema=pa.schema([("v", pa.string())]))
assert_type(ddl.schema, pa.Schema)  # always Arrow once made
# (pyarrow has no type stubs, so mypy cannot refuse Receiver(schema=42): ConfigError does.)


def union_of(ssc: StreamingContext, a: DataFrameStream, b: DataFrameStream) -> None:
    assert_type(ssc.union(a, b), UnionStream)
    assert_type(a.union(b), UnionStream)
    ssc.union([a, b])  # type: ignore[arg-type]


def status_of(ssc: StreamingContext) -> None:
    status = ssc.status()  # what it returns is public: importable from spark_receivers
    assert_type(status, StreamingStatus)
    assert_type(status.receivers[0], ReceiverStatus)
    assert_type(status.receivers[0].metrics, ReceiverMetricsInfo | None)
