"""What a stateful stream's state measured after one batch, for the progress's ``stateOperators``.

Every stream that keeps state across batches (``update_state_by_key``, ``map_with_state``,
``reduce_by_key_and_window`` with an inverse function) records one :class:`StateStats`
per batch it computed; the stream graph turns them into ``StateOperatorProgress``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StateStats:
    """The state of a stateful stream after one batch: its size and what it cost."""

    rows: int
    """Keys (state rows) after the batch."""
    update_ms: int
    """Computing the batch's state (keyed state: Spark's applyInPandas, the local checkpoint)."""
    save_ms: int = 0
    """Saving it to the checkpoint directory; 0 when not saved at this batch."""
    saved_bytes: int = 0


class StatefulStream(Protocol):
    """A stream whose state the progress reports: its operation, its name and its stats."""

    operation: str
    name: str

    def stats(self, batch_time_ms: int) -> StateStats | None:
        """The state after the batch at ``batch_time_ms``; None if this run did not compute it."""
        ...


def ms_since(began: float) -> int:
    """Milliseconds since ``began`` (a ``time.monotonic()`` reading), rounded."""
    return round((time.monotonic() - began) * 1000)
