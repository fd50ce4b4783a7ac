"""Capacities from the ladder's steps, over several runs: bounds, ratios as ranges, targets.

- :func:`capacities`: per (system, pipeline) of one run, ``lo`` = the highest rung that held
  below ``hi`` = the lowest rung that failed; the capacity is in ``[lo, hi)``. A session's
  warm-up step is no rung (``bench.harness.is_warm_up``).
- :func:`over_runs`: the same pair's capacity in each run (:class:`CapacityOverRuns`): its
  median bound and the spread of the bounds.
- :func:`ratio_range` / :func:`render_ratios`: a ratio of two capacities is a range, never a
  single figure: in one run ``[lo_a / hi_b, hi_a / lo_b]``, over runs from the lowest of the
  runs' lower ends to the highest of their upper ends.
- :func:`judge_targets`: a target is met only when, in every run, the ratio's whole bound
  clears it (:func:`bench.repeats.verdict`).
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.harness import StepResult, is_warm_up
from bench.repeats import Outcome, verdict

__all__ = [
    "Capacity",
    "CapacityOverRuns",
    "Target",
    "capacities",
    "judge_targets",
    "over_runs",
    "ratio_bounds",
    "ratio_range",
    "render_capacities",
    "render_ratios",
    "render_readme_paragraph",
]

PIPELINE_NAMES = {
    "wordcount": "one-action word count",
    "two_action": "two-action word count",
    "ingest": "line count",
    "windowed": "windowed word count (30 s window, 1 s slide, with the inverse)",
}


@dataclass(frozen=True)
class Capacity:
    """A (system, pipeline)'s capacity bounds: held at ``lo``, failed at ``hi`` (None: never)."""

    system: str
    pipeline: str
    lo: int | None
    hi: int | None
    noisy: bool = False
    """A rung above ``hi`` held in another session: the limit is blurred by noise."""

    def label(self) -> str:
        lo = "none held" if self.lo is None else f"{self.lo:,}"
        hi = "not reached" if self.hi is None else f"{self.hi:,}"
        return f"[{lo}, {hi})" + (" (noisy)" if self.noisy else "")


def capacities(steps: Sequence[StepResult]) -> list[Capacity]:
    """Per (system, pipeline) of one run, in first-run order: the bounds the rungs give."""
    groups: dict[tuple[str, str], list[int | None]] = {}
    held: dict[tuple[str, str], list[int]] = {}
    for s in steps:
        if s.offered_rate is None or is_warm_up(s):
            continue
        key = (s.system, s.pipeline)
        groups.setdefault(key, [])
        held.setdefault(key, [])
        if s.sustained:
            held[key].append(s.offered_rate)
        else:
            groups[key].append(s.offered_rate)
    out = []
    for (system, pipeline), failed_rates in groups.items():
        failed = [r for r in failed_rates if r is not None]
        hi = min(failed) if failed else None
        below = [r for r in held[(system, pipeline)] if hi is None or r < hi]
        lo = max(below) if below else None
        noisy = hi is not None and any(r > hi for r in held[(system, pipeline)])
        out.append(Capacity(system, pipeline, lo, hi, noisy))
    return out


def ratio_bounds(a: Capacity, b: Capacity) -> tuple[float, float]:
    """``a ÷ b`` in one run as ``(lo, hi)``: ``lo_a / hi_b`` to ``hi_a / lo_b`` (inf: unbounded)."""
    lo = 0.0 if a.lo is None or b.hi is None else a.lo / b.hi
    hi = math.inf if a.hi is None or b.lo is None else a.hi / b.lo
    return lo, hi


@dataclass(frozen=True)
class CapacityOverRuns:
    """One (system, pipeline)'s capacity in each run (None: not measured in that run)."""

    system: str
    pipeline: str
    runs: tuple[Capacity | None, ...]

    @property
    def measured(self) -> list[Capacity]:
        return [c for c in self.runs if c is not None]

    def median(self) -> Capacity:
        """The median bound: ``[median lo, median hi)`` (none held counts lowest, not
        reached highest; of an even count, the lower middle)."""
        caps = self.measured
        lows = [0 if c.lo is None else c.lo for c in caps]
        highs = [math.inf if c.hi is None else c.hi for c in caps]
        lo, hi = statistics.median_low(lows), statistics.median_low(highs)
        return Capacity(
            self.system,
            self.pipeline,
            None if lo == 0 else int(lo),
            None if math.isinf(hi) else int(hi),
            any(c.noisy for c in caps),
        )

    def spread(self) -> str:
        """The lowest and highest ends over the runs: ``held 432,000 to 540,000; failed ...``."""
        caps = self.measured

        def span(values: list[int | None], none: str) -> str:
            shown = sorted({none if v is None else f"{v:,}" for v in values}, key=_rung_key)
            return shown[0] if len(shown) == 1 else f"{shown[0]} to {shown[-1]}"

        return (
            f"held {span([c.lo for c in caps], 'none')}; "
            f"failed {span([c.hi for c in caps], 'not reached')}"
        )


def _rung_key(label: str) -> float:
    if label == "none":
        return -1.0
    if label == "not reached":
        return math.inf
    return float(label.replace(",", ""))


def over_runs(runs: Sequence[Sequence[Capacity]]) -> list[CapacityOverRuns]:
    """Each (system, pipeline) seen in any run, in first-seen order, with its bound per run."""
    keys = list(dict.fromkeys((c.system, c.pipeline) for run in runs for c in run))
    by_run = [{(c.system, c.pipeline): c for c in run} for run in runs]
    return [CapacityOverRuns(s, p, tuple(r.get((s, p)) for r in by_run)) for s, p in keys]


def ratio_range(a: CapacityOverRuns, b: CapacityOverRuns) -> tuple[float, float] | None:
    """``a ÷ b`` over the runs that measured both: the lowest lower end to the highest upper."""
    pairs = [ratio_bounds(x, y) for x, y in zip(a.runs, b.runs, strict=True) if x and y]
    if not pairs:
        return None
    return min(lo for lo, _ in pairs), max(hi for _, hi in pairs)


def _x(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.2f}x"


def _range(r: tuple[float, float] | None) -> str:
    return "-" if r is None else f"[{_x(r[0])}, {_x(r[1])}]"


def render_capacities(caps: Sequence[CapacityOverRuns]) -> str:
    """Each pair's bound per run, its median bound and the spread, as a Markdown table."""
    n = max((len(c.runs) for c in caps), default=1)
    rows = [
        "| system | pipeline | "
        + " | ".join(f"run {i}" for i in range(1, n + 1))
        + " | median bound | spread over the runs |",
        "|---|---|" + "---:|" * n + "---:|---|",
    ]
    for c in caps:
        cells = [("-" if r is None else r.label()) for r in c.runs]
        rows.append(
            f"| {c.system} | {c.pipeline} | "
            + " | ".join(cells)
            + f" | {c.median().label()} | {c.spread()} |"
        )
    return "\n".join(rows)


def render_ratios(caps: Sequence[CapacityOverRuns]) -> str:
    """Row system ÷ column system, per pipeline, as ranges over the runs."""
    parts = []
    for pipeline in dict.fromkeys(c.pipeline for c in caps):
        group = [c for c in caps if c.pipeline == pipeline]
        if len(group) < 2:
            continue
        rows = [
            f"| {pipeline}: row ÷ column | " + " | ".join(c.system for c in group) + " |",
            "|---|" + "---:|" * len(group),
        ]
        for a in group:
            cells = ["1" if a is b else _range(ratio_range(a, b)) for b in group]
            rows.append(f"| {a.system} | " + " | ".join(cells) + " |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


@dataclass(frozen=True)
class Target:
    """``system ÷ baseline >= at_least`` on ``pipeline``'s capacities."""

    pipeline: str
    system: str
    baseline: str
    at_least: float

    @property
    def name(self) -> str:
        return f"{self.pipeline}: {self.system} ÷ {self.baseline} ≥ {self.at_least:g}x"


def _outcome(lo: float, hi: float, at_least: float) -> Outcome:
    if lo >= at_least:
        return Outcome.MET
    if hi < at_least:
        return Outcome.MISSED
    return Outcome.UNDECIDED


def judge_targets(
    caps: Sequence[CapacityOverRuns],
    targets: Sequence[Target],
    floor_fails: Mapping[str, int] | None = None,
    grid: Sequence[int] = (),
) -> str:
    """A Markdown table: each target's bound per run, its range, and the verdict over runs.

    A run meets a target when its whole ratio bound clears it; the target is met only when
    every run meets it. ``floor_fails``: per pipeline, the smallest batch (lines) whose query
    Spark alone could not fit in a batch interval with the rows already in memory
    (``bench/query_floor.py``, on the ladder's rungs). A target not met is marked out of
    reach on this machine when even the lowest failed baseline rung of the runs, times the
    target, needs a rung of ``grid`` at or above that batch.
    """
    by = {(c.system, c.pipeline): c for c in caps}
    n = max((len(c.runs) for c in caps), default=1)
    rows = [
        "| target | " + " | ".join(f"run {i}" for i in range(1, n + 1))
        + " | range over the runs | verdict |",
        "|---|" + "---:|" * (n + 1) + "---|",
    ]  # fmt: skip
    for t in targets:
        a, b = by.get((t.system, t.pipeline)), by.get((t.baseline, t.pipeline))
        if a is None or b is None:
            rows.append(f"| {t.name} | " + "- | " * (n + 1) + "not measured in this run |")
            continue
        cells, outcomes = [], []
        for x, y in zip(a.runs, b.runs, strict=True):
            if x is None or y is None:
                cells.append("-")
                continue
            lo, hi = ratio_bounds(x, y)
            cells.append(f"[{_x(lo)}, {_x(hi)}]")
            outcomes.append(_outcome(lo, hi, t.at_least))
        text = verdict(outcomes)
        floor = (floor_fails or {}).get(t.pipeline)
        baseline_fails = [c.hi for c in b.measured if c.hi is not None]
        if not text.startswith("met") and floor is not None and baseline_fails:
            needed = t.at_least * min(baseline_fails)
            rung = min((r for r in grid if r >= needed), default=needed)
            if rung >= floor:
                on = f" (on this ladder {rung:,})" if rung != needed else ""
                text += (
                    f"; out of reach on this machine: it needs a rung of at least "
                    f"{needed:,.0f} lines/s held{on}, and Spark alone, with the rows already "
                    f"in memory, does not fit a batch of {floor:,} (query_floor)"
                )
        rows.append(
            f"| {t.name} | " + " | ".join(cells) + f" | {_range(ratio_range(a, b))} | {text} |"
        )
    return "\n".join(rows)


def render_readme_paragraph(
    caps: Sequence[CapacityOverRuns],
    targets: Sequence[Target],
    *,
    cores: int,
    cpu_model: str,
    when: dt.datetime,
    floor_fails: Mapping[str, int] | None = None,
    grid: Sequence[int] = (),
) -> str:
    """The README's performance paragraph, derived from one ``make bench``'s runs only."""
    by = {(c.system, c.pipeline): c for c in caps}
    n = max((len(c.runs) for c in caps), default=0)
    sentences = [
        f"Measured {when:%Y-%m-%d} on {cores} cores ({cpu_model}) in {n} "
        f"run{'s' if n != 1 else ''} of the ladder, every system in each run on the same "
        "rungs; a capacity `[a, b)` held at `a` lines/s and failed at `b` under the strict "
        "judge, given as the median bound of the runs, a ratio as the range over the runs "
        "(BENCHMARKS.md, `throughput`)."
    ]
    for pipeline, name in PIPELINE_NAMES.items():
        ours, peer = by.get(("spark_receivers", pipeline)), by.get(("dstream", pipeline))
        if ours is None:
            continue
        text = f"{name.capitalize()}: spark-receivers {ours.median().label()}"
        wal = by.get(("spark_receivers_wal", pipeline))
        if wal is not None:
            text += f", with both WALs {wal.median().label()}"
        if peer is not None:
            text += (
                f", DStream {peer.median().label()}: {_range(ratio_range(ours, peer))} "
                "DStream's capacity"
            )
        sentences.append(text + ".")
    verdicts = judge_targets(caps, targets, floor_fails, grid).splitlines()[2:]
    met = [row.split(" | ")[0].lstrip("| ") + " — " + row.split(" | ")[-1].rstrip(" |")
           for row in verdicts]  # fmt: skip
    if met:
        sentences.append("Targets: " + "; ".join(met) + ".")
    return " ".join(sentences)
