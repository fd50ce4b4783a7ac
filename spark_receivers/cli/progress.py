"""What ``ingest`` prints while it runs: one line per batch, receiver errors, lost blocks.

:class:`ProgressPrinter` is a streaming listener (its callbacks run on the
listener bus thread and only print). It counts honestly: a batch counts as
processed only when every output operation succeeded; a failed batch gets its
own line with its cause. :func:`one_line` turns an exception, Java ones included,
into the single line the command ends with.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from spark_receivers.driver.observe.listener import (
    BatchInfo,
    BlockLostInfo,
    ReceiverInfo,
    StreamingListener,
)

if TYPE_CHECKING:
    from spark_receivers.driver.observe.status import StreamingStatus

__all__ = ["ProgressPrinter", "one_line", "reason_of"]

MAX_REASON = 400
_JAVA_CAUSE = re.compile(r"^: ([\w.$]+(?:Exception|Error)\b.*)$", re.MULTILINE)
_PY_EXCEPTION = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*)$", re.MULTILINE
)


def _clip(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 1] + "…"


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line; a Py4J error gives its Java exception instead.

    A :class:`~spark_receivers.StreamingError` is unwrapped to its cause.
    """
    from spark_receivers.context import StreamingError

    while isinstance(error, StreamingError) and error.__cause__ is not None:
        error = error.__cause__
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            return _clip(str(java).splitlines()[0])
        except Exception:  # noqa: BLE001 - the JVM is gone: fall back to the Python text
            pass
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else ""
    return _clip(f"{type(error).__name__}: {message}" if message else type(error).__name__)


def reason_of(traceback_text: str) -> str:
    """The one line that says why, from a formatted traceback (a listener's failure_reason)."""
    java = _JAVA_CAUSE.findall(traceback_text)
    if java:
        return _clip(java[-1])
    found = _PY_EXCEPTION.findall(traceback_text)
    if found:
        return _clip(found[-1])
    lines = [x for x in traceback_text.strip().splitlines() if x.strip()]
    return _clip(lines[-1]) if lines else "unknown error"


class ProgressPrinter(StreamingListener):
    """Prints a line per batch (and per receiver error or lost block) to ``out``.

    ``status`` gives the receivers' states for the batch lines. Counters are read
    by the main thread at the end; they are updated under a lock.
    """

    def __init__(
        self,
        batch_interval_ms: int,
        status: Callable[[], StreamingStatus],
        out: TextIO | None = None,
    ) -> None:
        self._interval_s = batch_interval_ms / 1000.0
        self._status = status
        self._out = out or sys.stderr
        self._lock = threading.Lock()
        self.batches = 0
        """Batches whose every output operation succeeded."""
        self.records = 0
        """Records of those batches."""
        self.failed_batches = 0
        self.failed_records = 0
        self.submitted: dict[int, int] = {}
        """Records of every batch submitted, by batch time."""
        self._running: set[int] = set()

    def _say(self, text: str) -> None:
        print(text, file=self._out, flush=True)

    def on_batch_submitted(self, info: BatchInfo) -> None:
        """Remember the batch's records (to count what a recovered run had to redo)."""
        with self._lock:
            self.submitted[info.batch_time_ms] = info.num_records

    def on_batch_started(self, info: BatchInfo) -> None:
        """Remember the batch as running."""
        with self._lock:
            self._running.add(info.batch_time_ms)

    def running(self) -> set[int]:
        """Batches that started and whose end this listener has not seen."""
        with self._lock:
            return set(self._running)

    def on_batch_completed(self, info: BatchInfo) -> None:
        """One line: batch, input, rate, processing time, delay, receivers; or why it failed."""
        failures = [o.failure_reason for o in info.output_operations.values() if o.failure_reason]
        with self._lock:
            self._running.discard(info.batch_time_ms)
            if failures:
                self.failed_batches += 1
                self.failed_records += info.num_records
            else:
                self.batches += 1
                self.records += info.num_records
        self._show_batch(info, failures)

    def _show_batch(self, info: BatchInfo, failures: list[str]) -> None:
        """The batch's line (the live view and ``--progress json`` show batches their way)."""
        when = time.strftime("%H:%M:%S", time.localtime(info.batch_time_ms / 1000))
        if failures:
            self._say(
                f"batch {when}  in {info.num_records:>9,}  FAILED, nothing of it counts as "
                f"processed: {reason_of(failures[0])}"
            )
            return
        states = " ".join(f"{r.stream_id}={r.state}" for r in self._status().receivers)
        rate = info.num_records / self._interval_s
        processing, delay = info.processing_delay_ms or 0, info.scheduling_delay_ms or 0
        self._say(
            f"batch {when}  in {info.num_records:>9,} ({rate:>10,.0f}/s)  "
            f"proc {processing:>6} ms  delay {delay:>6} ms  receivers {states}"
        )

    def on_receiver_error(self, info: ReceiverInfo) -> None:
        """A receiver reported an error: its first line."""
        message = info.last_error_message.strip().splitlines()
        self._say(
            f"receiver {info.stream_id} ({info.name}): {_clip(message[0] if message else '')}"
        )

    def on_block_lost(self, info: BlockLostInfo) -> None:
        """A batch could not read a block: say how many records went with it."""
        self._say(
            f"batch {info.batch_time_ms}: lost block {info.block_id} of stream "
            f"{info.stream_id} ({info.num_records:,} records): {_clip(info.reason)}"
        )

    def counts(self) -> dict[str, Any]:
        """A copy of the counters."""
        with self._lock:
            return {
                "batches": self.batches,
                "records": self.records,
                "failed_batches": self.failed_batches,
                "failed_records": self.failed_records,
                "submitted": dict(self.submitted),
            }
