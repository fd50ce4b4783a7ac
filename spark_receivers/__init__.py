"""spark-receivers: receiver-based stream ingestion for PySpark.

Write a receiver for any push source in Python, run it as a long-lived Spark
task, and get every batch as a PySpark DataFrame.

The names below are loaded when first used (PEP 562): ``import spark_receivers`` itself
imports nothing else, so a Spark task that needs one module of the package (a receiver's,
a block keeper's, a batch read's) does not import the driver, every receiver and PySpark's
SQL modules with it: 0.7-0.8 CPU-seconds less in every Python worker that Spark starts, and
a block keeper process 0.66 CPU-s instead of 2.46 in the test suite (docs/decisions/0020).
``from spark_receivers import X`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_receivers.config import StreamingConfig
    from spark_receivers.context import ContextState, StreamingContext
    from spark_receivers.driver.observe.listener import (
        BatchInfo,
        BlockLostInfo,
        OutputOperationInfo,
        ReceiverInfo,
        ReplicationInfo,
        StreamingListener,
        StreamInputInfo,
    )
    from spark_receivers.driver.observe.receiver_metrics import ReceiverMetricsInfo
    from spark_receivers.driver.observe.status import ReceiverStatus, StreamingStatus
    from spark_receivers.driver.observe.streaming_progress import (
        OutputOperationProgress,
        SourceProgress,
        StateOperatorProgress,
        StreamingProgress,
    )
    from spark_receivers.errors import (
        AuthenticationError,
        BadRecordError,
        BlockNotFoundError,
        BlockStoreError,
        CheckpointError,
        ConfigError,
        CorruptRecordError,
        MissingDependencyError,
        OffsetError,
        ReceiverError,
        RpcError,
        SparkReceiversError,
        StateError,
        StreamingError,
        WriteAheadLogError,
    )
    from spark_receivers.receiver.receiver import Receiver
    from spark_receivers.receiver.schema import SchemaLike, as_arrow_schema
    from spark_receivers.receiver.storage_level import StorageLevel
    from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
    from spark_receivers.receivers import (
        FileTailReceiver,
        GeneratorReceiver,
        HttpReceiver,
        LineSource,
        MqttReceiver,
        RedisStreamReceiver,
        SocketTextReceiver,
    )
    from spark_receivers.stream import (
        DataFrameStream,
        ReceiverInputStream,
        StructuredReceiverStream,
        UnionStream,
    )

_EXPORTS: dict[str, str] = {
    "StreamingConfig": "spark_receivers.config",
    "ContextState": "spark_receivers.context",
    "StreamingContext": "spark_receivers.context",
    "BatchInfo": "spark_receivers.driver.observe.listener",
    "BlockLostInfo": "spark_receivers.driver.observe.listener",
    "OutputOperationInfo": "spark_receivers.driver.observe.listener",
    "ReceiverInfo": "spark_receivers.driver.observe.listener",
    "ReplicationInfo": "spark_receivers.driver.observe.listener",
    "StreamingListener": "spark_receivers.driver.observe.listener",
    "StreamInputInfo": "spark_receivers.driver.observe.listener",
    "ReceiverMetricsInfo": "spark_receivers.driver.observe.receiver_metrics",
    "ReceiverStatus": "spark_receivers.driver.observe.status",
    "StreamingStatus": "spark_receivers.driver.observe.status",
    "OutputOperationProgress": "spark_receivers.driver.observe.streaming_progress",
    "SourceProgress": "spark_receivers.driver.observe.streaming_progress",
    "StateOperatorProgress": "spark_receivers.driver.observe.streaming_progress",
    "StreamingProgress": "spark_receivers.driver.observe.streaming_progress",
    "AuthenticationError": "spark_receivers.errors",
    "BadRecordError": "spark_receivers.errors",
    "BlockNotFoundError": "spark_receivers.errors",
    "BlockStoreError": "spark_receivers.errors",
    "CheckpointError": "spark_receivers.errors",
    "ConfigError": "spark_receivers.errors",
    "CorruptRecordError": "spark_receivers.errors",
    "MissingDependencyError": "spark_receivers.errors",
    "OffsetError": "spark_receivers.errors",
    "ReceiverError": "spark_receivers.errors",
    "RpcError": "spark_receivers.errors",
    "SparkReceiversError": "spark_receivers.errors",
    "StateError": "spark_receivers.errors",
    "StreamingError": "spark_receivers.errors",
    "WriteAheadLogError": "spark_receivers.errors",
    "Receiver": "spark_receivers.receiver.receiver",
    "SchemaLike": "spark_receivers.receiver.schema",
    "as_arrow_schema": "spark_receivers.receiver.schema",
    "StorageLevel": "spark_receivers.receiver.storage_level",
    "ThreadedReceiver": "spark_receivers.receiver.threaded_receiver",
    "FileTailReceiver": "spark_receivers.receivers",
    "GeneratorReceiver": "spark_receivers.receivers",
    "HttpReceiver": "spark_receivers.receivers",
    "LineSource": "spark_receivers.receivers",
    "MqttReceiver": "spark_receivers.receivers",
    "RedisStreamReceiver": "spark_receivers.receivers",
    "SocketTextReceiver": "spark_receivers.receivers",
    "DataFrameStream": "spark_receivers.stream",
    "ReceiverInputStream": "spark_receivers.stream",
    "StructuredReceiverStream": "spark_receivers.stream",
    "UnionStream": "spark_receivers.stream",
}
"""Each public name and the module it is defined in (imported on first use)."""

__version__ = "0.1.0.dev0"

__all__ = [
    "AuthenticationError",
    "BadRecordError",
    "BatchInfo",
    "BlockLostInfo",
    "BlockNotFoundError",
    "BlockStoreError",
    "CheckpointError",
    "ConfigError",
    "ContextState",
    "CorruptRecordError",
    "DataFrameStream",
    "FileTailReceiver",
    "GeneratorReceiver",
    "HttpReceiver",
    "LineSource",
    "MissingDependencyError",
    "MqttReceiver",
    "OffsetError",
    "OutputOperationInfo",
    "OutputOperationProgress",
    "Receiver",
    "ReceiverError",
    "ReceiverInfo",
    "ReceiverInputStream",
    "ReceiverMetricsInfo",
    "ReceiverStatus",
    "RedisStreamReceiver",
    "ReplicationInfo",
    "RpcError",
    "SchemaLike",
    "SocketTextReceiver",
    "SourceProgress",
    "SparkReceiversError",
    "StateError",
    "StateOperatorProgress",
    "StorageLevel",
    "StreamInputInfo",
    "StreamingConfig",
    "StreamingContext",
    "StreamingError",
    "StreamingListener",
    "StreamingProgress",
    "StreamingStatus",
    "StructuredReceiverStream",
    "ThreadedReceiver",
    "UnionStream",
    "WriteAheadLogError",
    "__version__",
    "as_arrow_schema",
]


def __getattr__(name: str) -> Any:
    """Import the module of a public name on its first use and keep the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'spark_receivers' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
