"""How an ``ingest`` run ended: its last lines and its exit status (no Spark needed).

Exit statuses:

* ``0`` — it stopped as asked (``--seconds``, Ctrl-C, SIGTERM) and every record it
  received (and every record a recovered checkpoint had to redo) was processed by
  a batch that succeeded;
* ``1`` — the stream failed (a batch failed, the context failed), the source's
  server stayed unreachable (``--unreachable-timeout``, or at the stop), the stop
  left received records unprocessed, or a receiver never started and nothing was
  received (a recovered run too: it redid its checkpoint's batches, but received
  nothing new);
* ``2`` — a bad argument, URI, sink or setting (before Spark starts when it can be
  known then);
* ``130`` — stopped at once by a second Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_receivers.driver.observe.status import StreamingStatus

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "Outcome", "judge"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Outcome:
    """The exit status and the lines that explain it (the last one says why, if not 0)."""

    code: int
    lines: tuple[str, ...]


def judge(
    status: StreamingStatus,
    counts: Mapping[str, Any],
    failure: str | None,
    *,
    wal: bool,
    unstarted_at_stop: Collection[int] = (),
) -> Outcome:
    """The outcome of a run that has stopped.

    ``status``: the context's after the stop; ``counts``: the progress printer's
    (:meth:`ProgressPrinter.counts`); ``failure``: why the context failed, on one
    line, if it did; ``wal``: whether received records were in a write-ahead log;
    ``unstarted_at_stop``: the stream ids of the receivers that had not registered when
    the stop began.
    """
    submitted: Mapping[int, int] = counts.get("submitted", {})
    # A recovered run first redoes the batches a crash left unfinished: their records
    # come from the logs, not from this run's receivers.
    replayed = sum(submitted.get(t, 0) for t in status.recovered_batches_ms)
    received, processed = status.records_received, status.records_processed
    unprocessed = max(0, received + replayed - processed)
    done = (
        f"done: {status.batches_completed} batches, {processed:,} records processed, "
        f"{received:,} received"
    )
    if replayed:
        done += f" (+{replayed:,} redone from the checkpoint)"
    failed = int(counts.get("failed_batches", 0))
    if failed:
        done += f"; {failed} batch(es) failed ({int(counts.get('failed_records', 0)):,} records)"
    lines = [done]
    if unprocessed:
        if wal:
            lines.append(
                f"{unprocessed:,} received records were not processed; they are in the "
                "write-ahead log: run the same command again (same --checkpoint) to process them"
            )
        else:
            lines.append(
                f"{unprocessed:,} received records were not processed and are lost: they were "
                "held in executor memory only (--checkpoint DIR --wal keeps them)"
            )
    if failure is not None:
        return Outcome(EXIT_FAILED, (*lines, f"error: the stream failed: {failure}"))
    if unprocessed or status.pending_batches_ms:
        reason = (
            f"error: the stop left {unprocessed:,} received records unprocessed "
            f"(batches pending: {len(status.pending_batches_ms)}); a longer "
            "spark.streaming.gracefulStopTimeout gives the last batches more time"
        )
        return Outcome(EXIT_FAILED, (*lines, reason))
    # Never registered. Not a matter of when the run was stopped: a graceful stop lets a
    # receiver still starting finish first, within spark.receivers.receiver.startTimeout
    # of its launch (driver/job_scheduler.py), so this one failed to start, or no executor
    # ran its task for that long.
    never = [r for r in status.receivers if r.endpoint is None]
    if never and received == 0:
        r = never[0]
        why = (
            f"its last error: {r.last_error_message}"
            if r.last_error_message
            else "no executor ran its task within spark.receivers.receiver.startTimeout "
            "(are the executors' task slots all taken?)"
        )
        reason = (
            f"error: receiver {r.name} never started, so nothing was received; {why}. "
            "Check the source and the cluster"
        )
        return Outcome(EXIT_FAILED, (*lines, reason))
    # Registered only while the graceful stop waited for it: it started, and what it
    # received was processed, so the status stays 0 (it must not depend on when the run
    # was stopped); but a run that received nothing says why.
    late = [r for r in status.receivers if r.stream_id in unstarted_at_stop]
    if late and received == 0:
        lines.append(
            f"note: receiver {late[0].name} started only as the run was stopping, so nothing "
            "was received (its start was slow: a busy machine or executor; a longer run "
            "gives it time)"
        )
    return Outcome(EXIT_OK, tuple(lines))
