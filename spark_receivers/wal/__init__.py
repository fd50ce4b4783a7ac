"""Write-ahead logs: durable, checksummed, time-rolled record storage.

Used by both receivers (blocks) and the driver (block events). Public names:

* :class:`WriteAheadLog` - the interface; :class:`RecordHandle` - where a record lives;
  :func:`confine_handle` - refuse handles outside a log directory.
* :class:`FileBasedWriteAheadLog` - segment files on a local disk or any pyarrow filesystem.
* :class:`BatchedWriteAheadLog` - groups concurrent writes into one record.
* :func:`encode_frame` / :class:`FrameDecoder` - the on-disk record framing.
* :class:`CheckpointLayout` - every path under a checkpoint directory, resolved once.

Blocks as receiver-WAL records (codec and read-back) are in
:mod:`spark_receivers.wal.block_records`.

Fault injection for tests lives in :mod:`spark_receivers.wal.faults` (not re-exported).
"""

from spark_receivers.wal.base import RecordHandle, WriteAheadLog, confine_handle
from spark_receivers.wal.batched_log import (
    BatchedWriteAheadLog,
    deserialize_batch,
    serialize_batch,
)
from spark_receivers.wal.file_log import FileBasedWriteAheadLog, SegmentInfo
from spark_receivers.wal.framing import (
    DEFAULT_MAX_RECORD_BYTES,
    HEADER_SIZE,
    FrameDecoder,
    decode_bytes,
    encode_frame,
)
from spark_receivers.wal.layout import CheckpointLayout, resolve_filesystem

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "HEADER_SIZE",
    "BatchedWriteAheadLog",
    "CheckpointLayout",
    "FileBasedWriteAheadLog",
    "FrameDecoder",
    "RecordHandle",
    "SegmentInfo",
    "WriteAheadLog",
    "confine_handle",
    "decode_bytes",
    "deserialize_batch",
    "encode_frame",
    "resolve_filesystem",
    "serialize_batch",
]
