"""What ``ingest --progress live|json`` shows instead of one line per batch.

* :class:`LiveView` (``--progress live``, the default on a terminal): a view drawn
  with rich on stderr and redrawn twice a second: totals, input and processing
  rates, delays (last, average, max over the recent batches, against the batch
  interval), and a row per receiver (state, executor, rate, rate limit, records,
  bytes held, throttled time, bad records, restarts, last error). Receiver errors
  and lost blocks are printed above it, as lines.
* :class:`JsonProgress` (``--progress json``): one ``StreamingProgress`` JSON per
  batch on stdout (Structured Streaming's field names), for machines; the rest
  (errors, the final summary) stays on stderr.

Both count batches as :class:`~spark_receivers.cli.progress.ProgressPrinter`
does (the exit status is judged from those counts). Listener callbacks run on
the bus thread and never block; rich redraws on a thread of its own.

:func:`view_owns_the_terminal`: while the live view draws, nothing else may write to
the terminal behind rich's back (a line written there leaves a stale frame above the
view). The JVM, the receivers' Python workers it starts (in local mode their stderr is
the terminal) and logging handlers bound to the real stderr all write to file
descriptor 2; the command points it at a log file before Spark starts, and gives the
view and its own lines a copy of the terminal.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TextIO, cast

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from spark_receivers.cli.progress import ProgressPrinter, reason_of
from spark_receivers.driver.observe.listener import BatchInfo

if TYPE_CHECKING:
    from spark_receivers.driver.observe.status import StreamingStatus
    from spark_receivers.driver.observe.streaming_progress import StreamingProgress

__all__ = ["JsonProgress", "LiveView", "size", "view_owns_the_terminal"]

RECENT = 30
"""Batches the averages and maxima are taken over."""


def size(n: float) -> str:
    """Bytes as ``12.3 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GiB"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


@contextlib.contextmanager
def view_owns_the_terminal(live: bool) -> Iterator[str | None]:
    """Point file descriptor 2 at a log file while ``live``; yield its path (None: no change).

    ``sys.stderr`` becomes a copy of the terminal for the duration (the view and the
    command's own lines); whatever else writes to descriptor 2 — the JVM started inside,
    its Python workers, logging handlers made before — goes to the log. Restored on exit.
    """
    fd, path = -1, ""
    if live:
        # Nowhere to write the log: the view draws as before, stray lines and all.
        with contextlib.suppress(OSError):
            fd, path = tempfile.mkstemp(prefix="spark-receivers-ingest-", suffix=".log")
    if fd < 0:
        yield None
        return
    sys.stderr.flush()
    saved = os.dup(2)
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    previous = sys.stderr
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = terminal
    try:
        yield path
    finally:
        terminal.flush()
        os.dup2(saved, 2)
        os.close(saved)
        sys.stderr = previous
        terminal.close()


class LiveView(ProgressPrinter):
    """The live terminal view; see the module doc. ``start()``/``stop()`` around the run."""

    def __init__(
        self,
        batch_interval_ms: int,
        status: Callable[[], StreamingStatus],
        title: str,
        console: Console | None = None,
    ) -> None:
        self.console = console or Console(file=sys.stderr)
        super().__init__(batch_interval_ms, status, out=cast("TextIO", self.console.file))
        self._interval_ms = batch_interval_ms
        self.title = title
        self.url: str | None = None
        self._recent: deque[StreamingProgress] = deque(maxlen=RECENT)
        self._recent_lock = threading.Lock()
        self._started = time.monotonic()
        self._live: Live | None = None

    def start(self, url: str | None = None) -> None:
        """Start drawing (``url``: the status page's, shown in the header)."""
        self.url = url
        self._started = time.monotonic()
        self._live = Live(
            get_renderable=self.render,
            console=self.console,
            refresh_per_second=2,
            transient=False,
            # Our own lines (say(), warnings) print above the view instead of through it.
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self._live.start()

    def stop(self) -> None:
        """Draw a last time and stop; idempotent."""
        live, self._live = self._live, None
        if live is not None:
            live.refresh()
            live.stop()

    def _say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def _show_batch(self, info: BatchInfo, failures: list[str]) -> None:
        if failures:
            super()._show_batch(info, failures)

    def on_batch_progress(self, progress: StreamingProgress) -> None:
        """Keep the batch for the rates and delays (bus thread)."""
        with self._recent_lock:
            self._recent.append(progress)

    def render(self) -> RenderableType:
        """The view of this moment (also what a screenshot exports)."""
        status = self._status()
        with self._recent_lock:
            recent = list(self._recent)
        counts = self.counts()
        return Group(
            self._header(status),
            self._summary(status, recent, counts),
            self._receivers(status),
        )

    def _header(self, status: StreamingStatus) -> Text:
        up = time.monotonic() - self._started
        text = Text.assemble(
            ("spark-receivers ", "bold"),
            (self.title, "bold cyan"),
            f"   {status.state}   batch interval {self._interval_ms:,} ms   up {up:,.0f} s",
        )
        if self.url:
            text.append(f"\nstatus page {self.url}   Prometheus {self.url}metrics", "dim")
        if status.failure:
            text.append(f"\nfailed: {status.failure}", "bold red")
        return text

    def _summary(
        self, status: StreamingStatus, recent: list[StreamingProgress], counts: dict
    ) -> Text:
        def stat(label: str, values: list[float], unit: str) -> Text:
            if not values:
                return Text.assemble((f"{label} ", "dim"), "-")
            mean = sum(values) / len(values)
            return Text.assemble(
                (f"{label} ", "dim"),
                (f"{values[-1]:,.0f}", "bold"),
                f" {unit}",
                (f" (avg {mean:,.0f}, max {max(values):,.0f})", "dim"),
            )

        def value(label: str, number: str) -> Text:
            return Text.assemble((f"{label} ", "dim"), (number, "bold"))

        last = recent[-1] if recent else None
        gap = Text("   ")
        failed = counts["failed_batches"]
        totals = Text.assemble(
            value("received", f"{status.records_received:,}"), gap,
            value("processed", f"{counts['records']:,}"), gap,
            value("batches", f"{counts['batches']:,}"),
            (f" ({failed} failed)", "bold red" if failed else "dim"), gap,
            value("pending", f"{len(status.pending_batches_ms)}"), gap,
            value("batch interval", f"{self._interval_ms:,} ms"),
        )  # fmt: skip
        processed = "-" if last is None else f"{last.processed_rows_per_second:,.0f} rec/s"
        rates = Text.assemble(
            stat("input", [p.input_rows_per_second for p in recent], "rec/s"), gap,
            value("processed", processed),
        )  # fmt: skip
        delays = Text.assemble(
            stat("scheduling delay", [float(p.scheduling_delay_ms or 0) for p in recent], "ms"),
            gap, stat("processing", [float(p.batch_duration_ms) for p in recent], "ms"),
            gap, stat("total delay", [float(p.total_delay_ms or 0) for p in recent], "ms"),
        )  # fmt: skip
        lines = [totals, rates, delays]
        return Text("\n").join(lines)

    def _receivers(self, status: StreamingStatus) -> Table:
        table = Table(title=None, expand=False, header_style="bold", pad_edge=False)
        for name, justify in (
            ("stream", "right"), ("receiver", "left"), ("state", "left"), ("executor", "left"),
            ("rec/s", "right"), ("limit", "right"), ("records", "right"), ("held", "right"),
            ("throttled", "right"), ("bad", "right"), ("restarts", "right"),
            ("last error", "left"),
        ):  # fmt: skip
            wrap = name == "last error"
            table.add_column(name, justify=justify, no_wrap=not wrap)  # type: ignore[arg-type]
        for r in status.receivers:
            m = r.metrics
            limit = status.rate_limits.get(r.stream_id, m.rate_limit if m else None)
            style = {"ACTIVE": "green", "SCHEDULED": "yellow"}.get(r.state, "red")
            error = reason_of(r.last_error_message) if r.last_error_message else ""
            table.add_row(
                str(r.stream_id),
                r.name,
                Text(r.state, style=style),
                " / ".join(x for x in (r.executor_id, r.host) if x) or "-",
                f"{m.input_rate:,.0f}" if m else "-",
                "unlimited" if limit is None else f"{limit:,.0f}",
                f"{r.records:,}",
                size(m.store_memory_bytes + m.store_disk_bytes) if m else "-",
                f"{m.throttled_s:,.1f} s" if m else "-",
                f"{m.bad_records:,}" if m else "-",
                str(r.restarts),
                Text(error[:60], style="red"),
            )
        return table


class JsonProgress(ProgressPrinter):
    """``--progress json``: one progress JSON per batch on ``out`` (stdout); see the module doc."""

    def __init__(
        self,
        batch_interval_ms: int,
        status: Callable[[], StreamingStatus],
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        super().__init__(batch_interval_ms, status, out=err or sys.stderr)
        self._json_out = out or sys.stdout

    def _show_batch(self, info: BatchInfo, failures: list[str]) -> None:
        if failures:
            super()._show_batch(info, failures)

    def on_batch_progress(self, progress: StreamingProgress) -> None:
        """Print the batch's progress as one JSON line (bus thread)."""
        print(progress.json(), file=self._json_out, flush=True)
