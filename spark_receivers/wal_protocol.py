"""The part of the write-ahead log interface the driver and receivers depend on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol


class WriteAheadLogLike(Protocol):
    """What a WAL offers (see ``spark_receivers.wal.base.WriteAheadLog``)."""

    def write(self, data: bytes, time_ms: int) -> Any:
        """Durably append ``data``; return its handle."""
        ...

    def read_all(self) -> Iterator[bytes]:
        """Every record, oldest first."""
        ...

    def clean(self, threshold_time_ms: int, wait: bool) -> None:
        """Delete records older than the threshold."""
        ...

    def close(self) -> None:
        """Close the log."""
        ...
