"""spark-receivers: receiver-based stream ingestion for PySpark.

Write a receiver for any push source in Python, run it as a long-lived Spark
task, and get every batch as a PySpark DataFrame.
"""

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
