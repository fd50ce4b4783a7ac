"""The driver side of the Structured Streaming source: block logs, the offset endpoint.

The rest of the driver reaches this package through the names below only (its entry
points, checked by ``tests/test_architecture.py``): the block tracker owns the
:class:`BlockLogs` and writes their :data:`OffsetEvent` records to its WAL, the job
scheduler serves the :class:`OffsetEndpoint` (the messages of :data:`OFFSET_MESSAGES`)
that ``spark/stream_source.py`` calls from the query's side.
"""

from spark_receivers.driver.structured.block_log import (
    OFFSET_MESSAGES,
    BlockLogs,
    OffsetEndpoint,
    describe_streams,
)
from spark_receivers.driver.structured.offset_events import (
    OffsetCommitEvent,
    OffsetEvent,
    OffsetRangeEvent,
)

__all__ = [
    "OFFSET_MESSAGES",
    "BlockLogs",
    "OffsetCommitEvent",
    "OffsetEndpoint",
    "OffsetEvent",
    "OffsetRangeEvent",
    "describe_streams",
]
