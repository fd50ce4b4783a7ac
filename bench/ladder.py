"""The rate ladder: the same geometric rungs for every system, capacities as bounds.

- :func:`rung_grid`: the rungs, geometric and never more than :data:`RUNG_RATIO` apart.
- :func:`run_ladder`: per (pipeline, system), a **coarse** session that climbs every
  :data:`COARSE_EVERY`-th rung until its first unsustained step, then a **fine** session (a
  fresh JVM, so no step starts behind a backlog) that climbs every rung from the last coarse
  rung that held (its first step, where the fresh JVM warms up), until its own first
  unsustained step. Around each system's
  limit its rungs are therefore at most 1.25x apart, and every system gets the same rungs.
- :func:`capacities`: per (system, pipeline), ``lo`` = the highest rung that held below
  ``hi`` = the lowest rung that failed; the capacity is in ``[lo, hi)``.
- :func:`render_ratios` / :func:`judge_targets`: ratios of capacities as bounds
  ``[lo_a / hi_b, hi_a / lo_b]``, and a target counts as met only when the whole bound
  clears it.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from bench.harness import (
    SESSION_OVERHEAD_S,
    LadderResult,
    Machine,
    Runner,
    StepResult,
    render_steps_table,
)

__all__ = [
    "COARSE_EVERY",
    "PIPELINES",
    "RUNG_RATIO",
    "Capacity",
    "Target",
    "capacities",
    "judge_targets",
    "render_capacities",
    "render_ratios",
    "render_readme_paragraph",
    "render_throughput_section",
    "run_ladder",
    "rung_grid",
]

RUNG_RATIO = 1.25
COARSE_EVERY = 4  # the coarse session climbs 1.25 ** 4 = 2.44x per step
PIPELINES = ("wordcount", "two_action", "ingest")
"""``wordcount``: one action per batch; ``two_action``: ``count()`` and the word count on the
same batch (DStream: two output operations); ``ingest``: a line count."""


def rung_grid(lowest: int, highest: int, ratio: float = RUNG_RATIO) -> list[int]:
    """Geometric rungs from ``lowest`` to the first at or above ``highest``.

    Each rung is the one before times ``ratio``, floored to 3 significant digits, so two
    neighbours are never more than ``ratio`` apart.

    >>> rung_grid(10_000, 20_000)
    [10000, 12500, 15600, 19500, 24300]
    """
    if lowest <= 0 or ratio <= 1:
        raise ValueError(f"need lowest > 0 and ratio > 1, got {lowest} and {ratio}")
    rungs = [lowest]
    while rungs[-1] < highest:
        raw = rungs[-1] * ratio
        unit = 10 ** max(0, int(math.log10(raw)) - 2)
        rungs.append(max(rungs[-1] + 1, int(raw // unit * unit)))
    return rungs


def _first_failure(steps: Sequence[StepResult]) -> int | None:
    return next((s.offered_rate for s in steps if not s.sustained), None)


def run_ladder(
    systems: Mapping[str, Runner],
    grid: Sequence[int],
    step_s: float,
    *,
    pipelines: Sequence[str] = ("wordcount",),
    ingest_systems: Sequence[str] | None = None,
    batch_interval_s: float = 1.0,
    master: str = "local[4]",
    budget_s: float | None = None,
    coarse_every: int = COARSE_EVERY,
    coarse_step_s: float | None = None,
    fine: bool = True,
    on_step: Callable[[StepResult], None] | None = None,
) -> LadderResult:
    """Coarse then fine sessions per (pipeline, system), pipelines first; see the module doc.

    ``step_s`` is the fine sessions' step (and the coarse ones' unless ``coarse_step_s``);
    ``fine=False`` runs the coarse sessions only (a smoke run).
    ``ingest_systems`` limits the ``ingest`` pipeline to those systems (all by default).
    The budget is shared out as it goes: each session may use what is left divided by the
    sessions still to run (two per pair until a coarse session says no fine one is needed),
    so what an early-stopping system leaves goes to the ones after it.
    Blocks for the whole run; ``on_step`` is called on this thread after every step.
    """
    result = LadderResult(rates=list(grid))
    pairs = [
        (name, p)
        for p in pipelines
        for name in systems
        if p != "ingest" or ingest_systems is None or name in ingest_systems
    ]
    coarse = list(grid[::coarse_every])
    if coarse[-1] != grid[-1]:
        coarse.append(grid[-1])
    t0 = time.monotonic()

    def session(name: str, pipeline: str, rates: list[int], phase: str, left: int) -> bool:
        """Run one session; False when the budget could not afford it."""
        length = coarse_step_s or step_s if phase == "coarse" else step_s
        share = None
        if budget_s is not None:
            share = (budget_s - (time.monotonic() - t0)) / left
            if share < SESSION_OVERHEAD_S + length:
                result.skipped += [(name, pipeline, r) for r in rates]
                return False

        def tagged(step: StepResult) -> None:
            if on_step is not None:
                on_step(replace(step, extra={**step.extra, "phase": phase}))

        out = systems[name](
            rates,
            length,
            batch_interval_s,
            master,
            pipeline=pipeline,
            budget_s=share,
            on_step=tagged,
        )
        result.steps += [replace(s, extra={**s.extra, "phase": phase}) for s in out.steps]
        result.skipped += [(name, pipeline, r) for r in out.cut_rates]
        return True

    for i, (name, pipeline) in enumerate(pairs):
        left = 2 * (len(pairs) - i) if fine else len(pairs) - i
        before = len(result.steps)
        if not session(name, pipeline, coarse, "coarse", left):
            continue
        steps = result.steps[before:]
        failed = _first_failure(steps)
        if not fine or failed is None:
            continue
        held = [s.offered_rate for s in steps if s.sustained and s.offered_rate is not None]
        if not held:
            continue  # nothing held: the capacity is below the lowest rung
        # From the last coarse rung that held: a fresh JVM's first step is its warm-up (JIT,
        # first jobs), so it runs where the system is known to hold, and is judged again.
        # Up to a coarse step past the coarse failure, in case that failure was noise.
        start = grid.index(max(held))
        top = grid.index(failed) + coarse_every + 1
        session(name, pipeline, list(grid[start:top]), "fine", left - 1)
    result.elapsed_s = time.monotonic() - t0
    return result


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
    """Per (system, pipeline), in first-run order: the bounds the rungs give."""
    groups: dict[tuple[str, str], list[StepResult]] = {}
    for s in steps:
        if s.offered_rate is not None:
            groups.setdefault((s.system, s.pipeline), []).append(s)
    out = []
    for (system, pipeline), group in groups.items():
        failed = [s.offered_rate for s in group if not s.sustained]
        hi = min(failed) if failed else None  # type: ignore[type-var]
        held = [s.offered_rate for s in group if s.sustained]
        below = [r for r in held if hi is None or r < hi]  # type: ignore[operator]
        lo = max(below) if below else None  # type: ignore[type-var]
        noisy = hi is not None and any(r > hi for r in held)  # type: ignore[operator]
        out.append(Capacity(system, pipeline, lo, hi, noisy))  # type: ignore[arg-type]
    return out


def ratio_bounds(a: Capacity, b: Capacity) -> tuple[float, float]:
    """``a ÷ b`` as ``(lo, hi)``: ``lo_a / hi_b`` to ``hi_a / lo_b`` (inf when unbounded)."""
    lo = 0.0 if a.lo is None or b.hi is None else a.lo / b.hi
    hi = math.inf if a.hi is None or b.lo is None else a.hi / b.lo
    return lo, hi


def _x(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.2f}x"


def render_capacities(caps: Sequence[Capacity]) -> str:
    """The capacity bounds as a Markdown table."""
    rows = ["| system | pipeline | held (lines/s) | failed (lines/s) |", "|---|---|---:|---:|"]
    for c in caps:
        lo = "none" if c.lo is None else f"{c.lo:,}"
        hi = "not reached" if c.hi is None else f"{c.hi:,}"
        rows.append(f"| {c.system} | {c.pipeline} | {lo} | {hi}{' (noisy)' if c.noisy else ''} |")
    return "\n".join(rows)


def render_ratios(caps: Sequence[Capacity]) -> str:
    """Row system ÷ column system, per pipeline, as bounds ``[lo, hi]``."""
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
            cells = []
            for b in group:
                lo, hi = ratio_bounds(a, b)
                cells.append("1" if a is b else f"[{_x(lo)}, {_x(hi)}]")
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


def judge_targets(
    caps: Sequence[Capacity],
    targets: Sequence[Target],
    floor_fails: Mapping[str, int] | None = None,
    grid: Sequence[int] = (),
) -> str:
    """A Markdown table: each target met only when the lower bound clears it.

    ``floor_fails``: per pipeline, the smallest batch (lines) whose query Spark alone could
    not fit in a batch interval with the rows already in memory (``bench/query_floor.py``,
    same run, on the ladder's rungs). A target not met is marked out of reach on this
    machine when the lowest rung of ``grid`` that would meet it (the ladder's lower bound
    is a held rung) is at or above that batch.
    """
    by = {(c.system, c.pipeline): c for c in caps}
    rows = ["| target | measured bound | verdict |", "|---|---:|---|"]
    for t in targets:
        a, b = by.get((t.system, t.pipeline)), by.get((t.baseline, t.pipeline))
        name = f"{t.pipeline}: {t.system} ÷ {t.baseline} ≥ {t.at_least:g}x"
        if a is None or b is None:
            rows.append(f"| {name} | - | not measured in this run |")
            continue
        lo, hi = ratio_bounds(a, b)
        if lo >= t.at_least:
            verdict = "met"
        elif hi < t.at_least:
            verdict = "**not met**"
        else:
            verdict = "undecided: the bound straddles the target"
        floor = (floor_fails or {}).get(t.pipeline)
        if lo < t.at_least and floor is not None and b.hi is not None:
            needed = t.at_least * b.hi
            rung = min((r for r in grid if r >= needed), default=needed)
            if rung >= floor:
                on = f" (on this ladder {rung:,})" if rung != needed else ""
                verdict += (
                    f"; out of reach on this machine: it needs a rung of at least "
                    f"{needed:,.0f} lines/s held{on}, and Spark alone, with the rows already "
                    f"in memory, does not fit a batch of {floor:,} (query_floor)"
                )
        rows.append(f"| {name} | [{_x(lo)}, {_x(hi)}] | {verdict} |")
    return "\n".join(rows)


def render_throughput_section(
    result: LadderResult,
    *,
    machine: Machine,
    command: str,
    when: dt.datetime,
    notes: str,
    targets: Sequence[Target] = (),
    floor_fails: Mapping[str, int] | None = None,
) -> str:
    """The ``throughput`` section of BENCHMARKS.md (without its markers): this run only."""
    caps = capacities(result.steps)
    skipped = ""
    if result.skipped:
        items = ", ".join(f"{s}/{p}@{r:,}" for s, p, r in result.skipped)
        skipped = f"\nCut by the time budget (not run): {items}.\n"
    return "\n".join(
        [
            "## Throughput: word count over a TCP line server",
            "",
            f"Run {when:%Y-%m-%d %H:%M %Z} in {result.elapsed_s / 60:.1f} min with:",
            "",
            f"    {command}",
            "",
            machine.to_markdown(),
            "",
            notes.strip(),
            "",
            "### Capacity (offered lines/s)",
            "",
            render_capacities(caps),
            "",
            "The capacity is at least the highest rung that held and below the lowest rung "
            "that failed; “not reached” means the system held up to its last rung (the top of "
            "the ladder, or the budget ended first).",
            "",
            "### Targets",
            "",
            judge_targets(caps, targets, floor_fails, result.rates) if targets else "(none)",
            "",
            "### Ratios, as bounds",
            "",
            render_ratios(caps) or "(one system only)",
            "",
            "### Every step",
            "",
            render_steps_table(result.steps),
            skipped,
        ]
    )


def render_readme_paragraph(
    caps: Sequence[Capacity],
    targets: Sequence[Target],
    *,
    machine: Machine,
    when: dt.datetime,
    floor_fails: Mapping[str, int] | None = None,
    grid: Sequence[int] = (),
) -> str:
    """The README's performance paragraph, derived from one ladder run's capacities only."""
    by = {(c.system, c.pipeline): c for c in caps}
    sentences = [
        f"Measured {when:%Y-%m-%d} on {machine.cores} cores ({machine.cpu_model}), "
        "every system in the same run on the same rungs; a capacity `[a, b)` held at `a` "
        "lines/s and failed at `b` under the strict judge (BENCHMARKS.md, `throughput`)."
    ]
    names = {"wordcount": "one-action word count", "two_action": "two-action word count",
             "ingest": "line count"}  # fmt: skip
    for pipeline in PIPELINES:
        ours, peer = by.get(("spark_receivers", pipeline)), by.get(("dstream", pipeline))
        if ours is None:
            continue
        text = f"{names[pipeline].capitalize()}: spark-receivers {ours.label()}"
        wal = by.get(("spark_receivers_wal", pipeline))
        if wal is not None:
            text += f", with both WALs {wal.label()}"
        if peer is not None:
            lo, hi = ratio_bounds(ours, peer)
            text += f", DStream {peer.label()}: [{_x(lo)}, {_x(hi)}] DStream's capacity"
        sentences.append(text + ".")
    verdicts = judge_targets(caps, targets, floor_fails, grid).splitlines()[2:]
    met = [row.split("|")[1].strip() + " — " + row.split("|")[3].strip() for row in verdicts]
    if met:
        sentences.append("Targets: " + "; ".join(met) + ".")
    return " ".join(sentences)
