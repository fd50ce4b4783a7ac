"""The rate ladder: the same geometric rungs for every system, climbed session by session.

- :func:`rung_grid`: the rungs, geometric and never more than :data:`RUNG_RATIO` apart.
- :func:`run_ladder`: per (pipeline, system), a **coarse** session that climbs every
  :data:`COARSE_EVERY`-th rung until its first unsustained step, then a **fine** session (a
  fresh JVM, so no step starts behind a backlog) that climbs every rung from
  :data:`FINE_START_BELOW` (1.56x) below the last coarse rung that held, until its own first
  unsustained step. Around each system's limit its rungs are therefore at most 1.25x
  apart, and every system gets the same rungs. Every session begins with
  :data:`WARM_UP_STEPS` unjudged step at its first rung (the fresh JVM's warm-up: see
  :class:`bench.harness.Runner`), then judges that rung and the ones above.

What the steps say about capacities, ratios and targets, over several runs of the ladder, is
``bench/capacity.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from bench.harness import SESSION_OVERHEAD_S, LadderResult, Runner, StepResult, is_warm_up

__all__ = [
    "COARSE_EVERY",
    "EXTRA_PIPELINES",
    "FINE_WARM_UP_RUNGS",
    "PIPELINES",
    "RUNG_RATIO",
    "WARM_UP_STEPS",
    "fine_rungs_below",
    "run_ladder",
    "rung_grid",
]

RUNG_RATIO = 1.25
COARSE_EVERY = 4  # the coarse session climbs 1.25 ** 4 = 2.44x per step
FINE_WARM_UP_RUNGS = 2  # the fine session starts 1.25 ** 2 = 1.56x below the coarse hold
FINE_START_BELOW = RUNG_RATIO**FINE_WARM_UP_RUNGS
"""How far below the last coarse rung that held a fine session starts, at any spacing
(:func:`fine_rungs_below`)."""
WARM_UP_STEPS = 1
"""Steps at a session's first rung before it is judged. A fresh JVM's first step carries
its start: the first real batches (JIT, first jobs, the cache's first build) can leave a
backlog that a batch near the interval drains too slowly for that step to pass. Without
it, 2 of the 12 sessions of 2026-11-28's three Connect ladders failed their first step
far below what the same system held in its other sessions (a coarse session at 40,000
lines/s, a fine one at 62,500 under a coarse hold of 97,600), and each made its run's
bound meaningless ([none held, 40,000), [40,000, 62,500) noisy)."""
PIPELINES = ("wordcount", "two_action", "ingest")
"""``wordcount``: one action per batch; ``two_action``: ``count()`` and the word count on the
same batch (DStream: two output operations); ``ingest``: a line count."""
EXTRA_PIPELINES = ("windowed",)
"""Run only when named (``--pipelines windowed``): the line count, then a word count over
30 s every second, incremental with the inverse (issue 35's windowed comparison)."""


def fine_rungs_below(spacing: float) -> int:
    """Rungs ``spacing`` apart that a fine session starts below the coarse hold: the fewest
    that span :data:`FINE_START_BELOW` (2 at the default spacing, 5 at 1.1x).

    Two rungs at 1.1x were only 1.21x below the hold: the fine sessions of the Connect
    ladder of 2026-11-29 18:11 warmed up at 372,000 lines/s under a hold of 449,000, where
    a fresh JVM's first ten batches with lines ran 0.8-1.4 s, most over 1 s (a probe at
    21:38, both systems), and the delay was back near 0 only 20-22 s after the first,
    past the 15 s warm-up step; so the judged step at that rung began behind it.
    """
    if spacing <= 1:
        raise ValueError(f"spacing must be > 1, got {spacing}")
    return max(1, math.ceil(math.log(FINE_START_BELOW) / math.log(spacing) - 1e-9))


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
    warm_up_steps: int = WARM_UP_STEPS,
    spacing: float = RUNG_RATIO,
) -> LadderResult:
    """Coarse then fine sessions per (pipeline, system), pipelines first; see the module doc.

    ``step_s`` is the fine sessions' step (and the coarse ones' unless ``coarse_step_s``);
    ``fine=False`` runs the coarse sessions only (a smoke run). ``warm_up_steps``: each
    session's unjudged steps at its first rung (:data:`WARM_UP_STEPS`);
    ``spacing``: the ratio of ``grid``'s rungs (:func:`rung_grid`'s ``ratio``), which sets
    how many rungs below the last coarse rung that held a fine session starts
    (:func:`fine_rungs_below`).
    ``ingest_systems`` limits the ``ingest`` pipeline to those systems (all by default).
    The budget is shared out as it goes: each session may use what is left divided by the
    sessions still to run (two per pair until a coarse session says no fine one is needed),
    or, when that is less than its rungs need, as much of what is left as keeps one judged
    step (and the session's overhead) for every session after it; what an early-stopping
    system leaves goes to the ones after it.
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
            remaining = budget_s - (time.monotonic() - t0)
            least = SESSION_OVERHEAD_S + (warm_up_steps + 1) * length  # one judged step
            need = SESSION_OVERHEAD_S + (warm_up_steps + len(rates)) * length  # every rung
            # Its even share, or more: all its rungs, as long as every session after it can
            # still have its least. An even share alone cut the word count's fine sessions
            # (the first pipeline's) after 4-5 rungs on a slow host while the runs ended 6-7
            # minutes under budget (2026-11-29).
            share = max(remaining / left, min(need, remaining - (left - 1) * least))
            if share < least:
                result.skipped += [(name, pipeline, r) for r in rates]
                return False

        def tagged(step: StepResult) -> None:
            if on_step is not None:
                on_step(replace(step, extra={**step.extra, "phase": phase}))

        out = systems[name](
            [rates[0]] * warm_up_steps + rates,
            length,
            batch_interval_s,
            master,
            pipeline=pipeline,
            budget_s=share,
            on_step=tagged,
            warm_up_steps=warm_up_steps,
        )
        result.steps += [replace(s, extra={**s.extra, "phase": phase}) for s in out.steps]
        result.skipped += [(name, pipeline, r) for r in out.cut_rates]
        return True

    for i, (name, pipeline) in enumerate(pairs):
        left = 2 * (len(pairs) - i) if fine else len(pairs) - i
        before = len(result.steps)
        if not session(name, pipeline, coarse, "coarse", left):
            continue
        steps = [s for s in result.steps[before:] if not is_warm_up(s)]  # the judged ones
        failed = _first_failure(steps)
        if not fine or failed is None:
            continue
        held = [s.offered_rate for s in steps if s.sustained and s.offered_rate is not None]
        if not held:
            continue  # nothing held: the capacity is below the lowest rung
        # From FINE_START_BELOW under the last coarse rung that held: the session's
        # warm-up runs well below where the system is known to hold, and the rungs up to
        # that one are judged again. Starting at the held rung itself, a first step that
        # failed there ended the session with no fine rung run (2026-11-28: the two-action
        # bound stayed [143,000, 346,000), 2.4x wide, in 3 of 5 sessions); that was before
        # the unjudged warm-up step. Up to a coarse step past the coarse failure, in case it
        # was noise.
        start = max(0, grid.index(max(held)) - fine_rungs_below(spacing))
        top = grid.index(failed) + coarse_every + 1
        session(name, pipeline, list(grid[start:top]), "fine", left - 1)
    result.elapsed_s = time.monotonic() - t0
    return result
