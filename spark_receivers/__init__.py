"""spark-receivers: receiver-based stream ingestion for PySpark.

Write a receiver for any push source in Python, run it as a long-lived Spark
task, and get every batch as a PySpark DataFrame.
"""

from spark_receivers.config import StreamingConfig
from spark_receivers.context import ContextState, StreamingContext, StreamingError
from spark_receivers.driver.listener import (
    BatchInfo,
    BlockLostInfo,
    OutputOperationInfo,
    ReceiverInfo,
    StreamingListener,
)
from spark_receivers.errors import (
    BlockNotFoundError,
    ConfigError,
    OffsetError,
    ReceiverError,
    RpcError,
    SparkReceiversError,
    StateError,
    WriteAheadLogError,
)
from spark_receivers.receiver.block_store import StorageLevel
from spark_receivers.receiver.receiver import Receiver
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
from spark_receivers.stream import DataFrameStream, ReceiverInputStream, StructuredReceiverStream

__version__ = "0.1.0.dev0"

__all__ = [
    "BatchInfo",
    "BlockLostInfo",
    "BlockNotFoundError",
    "ConfigError",
    "ContextState",
    "DataFrameStream",
    "FileTailReceiver",
    "GeneratorReceiver",
    "HttpReceiver",
    "LineSource",
    "MqttReceiver",
    "OffsetError",
    "OutputOperationInfo",
    "Receiver",
    "ReceiverError",
    "ReceiverInfo",
    "ReceiverInputStream",
    "RedisStreamReceiver",
    "RpcError",
    "SocketTextReceiver",
    "SparkReceiversError",
    "StateError",
    "StorageLevel",
    "StreamingConfig",
    "StreamingContext",
    "StreamingError",
    "StreamingListener",
    "StructuredReceiverStream",
    "ThreadedReceiver",
    "WriteAheadLogError",
    "__version__",
]
