"""The throughput benchmark's data model, rate ladder and report writer.

- :class:`CpuSampler`: the machine's busy cores over a step (``bench/record.py`` says
  where a whole run comes from: commit, machine, load).
- :class:`BatchSample` / :class:`StepResult`: one batch as a system reported it, and one
  (system, pipeline, offered rate) step reduced to the numbers we compare.
- :func:`summarize_step`: the one place that decides "sustained", shared by every system.
- :class:`Runner` / :class:`SessionResult`: one session of one system (one JVM) over rising
  rates; the ladder that calls them is ``bench/ladder.py``.
- :func:`render_steps_table`: every step as a Markdown table.

Every time is ``time.monotonic()`` seconds (one system-wide clock on Linux), every duration in
a name ending ``_ms`` or ``_s``.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from bench.machine import busy_cpu_seconds

__all__ = [
    "OFFERED_FRACTION",
    "PROCESSED_FRACTION",
    "BatchSample",
    "CpuSampler",
    "LadderResult",
    "Runner",
    "SessionResult",
    "StepResult",
    "is_warm_up",
    "render_steps_table",
    "stat_cpu_seconds",
    "summarize_step",
]

PROCESSED_FRACTION = 0.95  # processed / sent, at the end of the drain
OFFERED_FRACTION = 0.95  # sent / (rate * seconds): below it, the consumer pushed back over TCP
LATENCY_SAMPLES = 100  # lines per batch whose end-to-end latency is taken
DELAY_GROWTH_LIMIT = 0.02  # ms of scheduling delay per ms of batch time, in a step's last third
SESSION_OVERHEAD_S = 45.0  # JVM start, warm-up, stop: what a session costs besides its steps


# -- the machine ------------------------------------------------------------------------------


def stat_cpu_seconds(stat_path: str) -> float:
    """User + system CPU seconds from a ``/proc`` stat file: a process's
    (``/proc/<pid>/stat``) or one of its threads' (``/proc/<pid>/task/<tid>/stat``)."""
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)


class CpuSampler:
    """The machine's busy CPU over time, from ``/proc/stat``, to read back per window.

    A thread samples the busy jiffies of all cores (everything but idle and iowait) every
    ``period_s``; :meth:`busy_cores` gives the mean number of cores busy between two
    monotonic times (interpolated between samples). On a quiet machine that is the
    benchmark's own CPU: every process of it, whatever started them (JVMs, Python workers,
    block keepers, the load generator). None where the window is not covered (not Linux).
    """

    def __init__(self, period_s: float = 0.25) -> None:
        self._period_s = period_s
        self._samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            busy = busy_cpu_seconds()
            if busy is None:
                return
            self._samples.append((time.monotonic(), busy))
            if self._stop.wait(self._period_s):
                return

    def _at(self, t: float) -> float | None:
        samples = list(self._samples)
        for (t0, b0), (t1, b1) in itertools.pairwise(samples):
            if t0 <= t <= t1:
                return b0 + (b1 - b0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
        return None

    def busy_cores(self, start_s: float, end_s: float) -> float | None:
        """Mean cores busy over ``[start_s, end_s]`` (monotonic seconds), or None."""
        a, b = self._at(start_s), self._at(end_s)
        if a is None or b is None or end_s <= start_s:
            return None
        return (b - a) / (end_s - start_s)


# -- one step ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchSample:
    """One batch as a system reported it.

    ``batch_time_s`` is when the batch's input was cut (DStream: the batch time; Structured:
    the trigger's start), ``completed_s`` when its output finished, both monotonic.
    ``lines`` is counted by the pipeline itself (in the same job as the word count);
    ``records`` is what the engine reports as input rows, for a cross-check.
    """

    batch_id: int
    batch_time_s: float
    completed_s: float
    lines: int
    processing_ms: float
    scheduling_delay_ms: float | None = None
    records: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> BatchSample:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})  # type: ignore[arg-type]


@dataclass(frozen=True)
class StepResult:
    """One (system, pipeline, offered rate) step.

    Batch processing times and scheduling delays are taken over the steady-state window, the
    second half of the send window. ``latency_*`` is end-to-end per line, over the lines of
    the batches in that window (:data:`LATENCY_SAMPLES` evenly spaced lines of each): batch
    completion minus the load generator's send time of that line.
    """

    system: str
    pipeline: str
    offered_rate: int | None
    seconds: float
    lines_sent: int
    lines_processed: int
    batches_in_window: int = 0
    batch_p50_ms: float | None = None
    batch_p95_ms: float | None = None
    sched_delay_p50_ms: float | None = None
    sched_delay_max_ms: float | None = None
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_max_ms: float | None = None
    sustained: bool = False
    reason: str = ""
    error: str | None = None
    wall_s: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def sent_rate(self) -> float:
        return self.lines_sent / self.seconds if self.seconds > 0 else 0.0

    @property
    def processed_rate(self) -> float:
        return self.lines_processed / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> StepResult:
        """The inverse of :meth:`to_dict`; fields older raw files held are ignored."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})  # type: ignore[arg-type]


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil without floats drifting
    return float(ordered[int(rank) - 1])


def delay_slope(samples: Sequence[BatchSample]) -> float | None:
    """Least-squares slope of scheduling delay (ms) against batch time (ms); None below 2."""
    points = [
        (b.batch_time_s * 1000.0, b.scheduling_delay_ms)
        for b in samples
        if b.scheduling_delay_ms is not None
    ]
    if len(points) < 2:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_d = sum(d for _, d in points) / len(points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mean_t) * (d - mean_d) for t, d in points) / var


def summarize_step(
    *,
    system: str,
    pipeline: str,
    offered_rate: int | None,
    seconds: float,
    batch_interval_s: float,
    lines_sent: int,
    started_at_s: float | None,
    send_time_of: Callable[[int], float],
    batches: Iterable[BatchSample],
    lines_before: int = 0,
    error: str | None = None,
    wall_s: float = 0.0,
    extra: Mapping[str, object] | None = None,
) -> StepResult:
    """Reduce one step's batches to a :class:`StepResult` and decide whether it was sustained.

    A step is one rate of a session: ``started_at_s`` is when it began (monotonic),
    ``lines_before`` how many lines the session had sent before it, ``lines_sent`` how many
    it sent; ``batches`` are every batch of the session that had completed when the step is
    judged (a few batch intervals after its end). Lines arrive in order on one connection, so
    the lines processed so far are the first ones sent, and the step's processed lines are
    those of its own sequence numbers: ``total - lines_before``, at most ``lines_sent``.

    Sustained means all of (the judge is stricter than any claim made from it):

    1. processed >= 95 % of sent (when the step is judged);
    2. sent >= 95 % of ``offered_rate * seconds``: a receiver that cannot keep up pushes back
       over TCP, and then the load generator cannot offer the rate at all;
    3. at least two batches in the steady-state window (the second half of the step) and
       their p50 processing time below one batch interval;
    4. in the last third of the step, at least two batches, every scheduling delay below one
       batch interval, and the delay not growing: its least-squares slope against batch
       time at most :data:`DELAY_GROWTH_LIMIT` (a backlog that grows by 2 % of the elapsed
       time grows by a whole interval within 50 intervals);
    5. no error.

    Latency uses the sequence numbers: lines arrive in order on one connection, so a batch
    holds the lines from ``(lines processed before it)`` to ``(lines processed up to and
    including it) - 1``.
    """
    ordered = sorted(batches, key=lambda b: (b.batch_time_s, b.batch_id))
    processed = max(0, min(sum(b.lines for b in ordered) - lines_before, lines_sent))
    window: list[BatchSample] = []
    last_third: list[BatchSample] = []
    latencies: list[float] = []
    if started_at_s is not None:
        lo, hi = started_at_s + seconds / 2, started_at_s + seconds
        third = started_at_s + seconds * 2 / 3
        cumulative = 0
        for b in ordered:
            cumulative += b.lines
            if not lo <= b.batch_time_s < hi:
                continue
            window.append(b)
            if b.batch_time_s >= third:
                last_third.append(b)
            if b.lines > 0 and cumulative <= lines_before + lines_sent:
                first, k = cumulative - b.lines, min(LATENCY_SAMPLES, b.lines)
                for i in range(1, k + 1):  # the last sample is the batch's newest line
                    seq = first + (i * b.lines) // k - 1
                    latencies.append((b.completed_s - send_time_of(seq)) * 1000)
    processing = [b.processing_ms for b in window]
    delays = [b.scheduling_delay_ms for b in window if b.scheduling_delay_ms is not None]
    late = [b.scheduling_delay_ms for b in last_third if b.scheduling_delay_ms is not None]
    slope = delay_slope(last_third)
    interval_ms = batch_interval_s * 1000
    p50 = _percentile(processing, 50)

    reasons = []
    if error:
        reasons.append(f"error: {error[:160]}")
    if processed < PROCESSED_FRACTION * lines_sent or lines_sent == 0:
        reasons.append(f"processed {processed}/{lines_sent} sent")
    if offered_rate is not None and lines_sent < OFFERED_FRACTION * offered_rate * seconds:
        reasons.append(f"sent only {lines_sent / seconds:,.0f}/s (TCP backpressure)")
    if len(window) < 2 and started_at_s is not None:
        cut = [b.batch_time_s - started_at_s for b in ordered if b.lines > 0]
        last = f"; the last batch that completed was cut at {max(cut):.1f} s" if cut else ""
        reasons.append(f"{len(window)} batches of the second half completed{last} (backlog)")
        if not delays:  # show how far behind it was rather than nothing
            delays = [b.scheduling_delay_ms for b in ordered if b.scheduling_delay_ms is not None]
    elif len(window) < 2:
        reasons.append(f"{len(window)} batches in the steady-state window")
    else:
        if p50 is not None and p50 >= interval_ms:
            reasons.append(f"batch p50 {p50:,.0f} ms >= the {interval_ms:,.0f} ms interval")
        if len(late) < 2:
            reasons.append(f"{len(late)} batches with a delay in the last third")
        elif max(late) >= interval_ms:
            reasons.append(f"scheduling delay reached {max(late):,.0f} ms in the last third")
        if slope is not None and slope > DELAY_GROWTH_LIMIT:
            reasons.append(f"scheduling delay growing ({slope * 1000:,.0f} ms per s)")
    return StepResult(
        system=system,
        pipeline=pipeline,
        offered_rate=offered_rate,
        seconds=seconds,
        lines_sent=lines_sent,
        lines_processed=processed,
        batches_in_window=len(window),
        batch_p50_ms=p50,
        batch_p95_ms=_percentile(processing, 95),
        sched_delay_p50_ms=_percentile(delays, 50),
        sched_delay_max_ms=max(delays) if delays else None,
        latency_p50_ms=_percentile(latencies, 50),
        latency_p99_ms=_percentile(latencies, 99),
        latency_max_ms=max(latencies) if latencies else None,
        sustained=not reasons,
        reason="; ".join(reasons),
        error=error,
        wall_s=wall_s,
        extra={
            **(extra or {}),
            "delay_growth_ms_per_s": None if slope is None else round(slope * 1000, 1),
        },
    )


# -- the ladder -------------------------------------------------------------------------------


class Runner(Protocol):
    """Runs one session of one system; see ``bench/run.py`` for how to register one.

    A session starts the system once and offers ``rates`` one after the other, ``step_s``
    each, on the same connection; it ends after the first unsustained step, or before a
    step that would end past ``budget_s`` from the call. It returns the steps it judged and
    the rates it did not reach because of the budget. The first ``warm_up_steps`` steps
    are the session's warm-up: judged and returned like the others (``extra["warm_up"]``
    true), but one that fails does not end the session, and :func:`is_warm_up` keeps them
    out of every capacity.
    """

    def __call__(
        self,
        rates: Sequence[int],
        step_s: float,
        batch_interval_s: float = 1.0,
        master: str = "local[4]",
        *,
        pipeline: str = "wordcount",
        budget_s: float | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        warm_up_steps: int = 0,
    ) -> SessionResult: ...


def is_warm_up(step: StepResult) -> bool:
    """A session's warm-up step (see :class:`Runner`): reported, never a capacity's rung."""
    return bool(step.extra.get("warm_up"))


@dataclass
class SessionResult:
    """What one session (one system, one pipeline, one JVM) measured."""

    steps: list[StepResult] = field(default_factory=list)
    cut_rates: list[int] = field(default_factory=list)
    """Rates of the schedule not run because the budget ended first."""


@dataclass
class LadderResult:
    """Every step run, in order, and the (system, pipeline, rate) steps the budget cut."""

    rates: list[int]
    steps: list[StepResult] = field(default_factory=list)
    skipped: list[tuple[str, str, int]] = field(default_factory=list)
    elapsed_s: float = 0.0


# -- reporting --------------------------------------------------------------------------------


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def _rate(rate: int | None) -> str:
    return "flat out" if rate is None else f"{rate:,}"


def _phase(step: StepResult) -> str:
    phase = str(step.extra.get("phase", "-"))
    return f"{phase} (warm-up)" if is_warm_up(step) else phase


def render_steps_table(steps: Sequence[StepResult]) -> str:
    """Every step as a Markdown table."""
    rows = [
        "| system | pipeline | phase | offered lines/s | sent lines/s | processed lines/s "
        "| batch p50 / p95 ms | sched delay p50 / max ms | delay growth ms/s "
        "| latency p50 / p99 / max ms | load 1m | busy cores | sustained |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in steps:
        verdict = "yes" if s.sustained else f"no: {s.reason}"
        growth = s.extra.get("delay_growth_ms_per_s")
        rows.append(
            f"| {s.system} | {s.pipeline} | {_phase(s)} "
            f"| {_rate(s.offered_rate)} | {_num(s.sent_rate)} "
            f"| {_num(s.processed_rate)} | {_num(s.batch_p50_ms)} / {_num(s.batch_p95_ms)} "
            f"| {_num(s.sched_delay_p50_ms)} / {_num(s.sched_delay_max_ms)} "
            f"| {_num(growth if isinstance(growth, int | float) else None)} "
            f"| {_num(s.latency_p50_ms)} / {_num(s.latency_p99_ms)} / {_num(s.latency_max_ms)} "
            f"| {_load(s)} | {_busy(s)} | {verdict} |"
        )
    return "\n".join(rows)


def _busy(step: StepResult) -> str:
    """The machine's mean busy cores over the step (all processes, /proc/stat), if recorded."""
    busy = step.extra.get("busy_cores")
    return f"{busy:.2f}" if isinstance(busy, int | float) else "-"


def _load(step: StepResult) -> str:
    """The 1-minute load average around a step (the higher of start and end), if recorded."""
    load = step.extra.get("load_1m")
    return f"{load:.1f}" if isinstance(load, int | float) else "-"
