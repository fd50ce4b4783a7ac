"""The throughput section: the rate ladder of every system, run several times (issues 11, 20, 30).

    python -m bench.throughput                        # 3 runs of the ladder, <= 40 min each
    python -m bench.throughput --quick                # smoke: 1 run, 2 rungs, coarse only
    python -m bench.throughput --systems dstream --pipelines two_action --repeats 1

Each run of the ladder (``bench/ladder.py``) gives every system the same geometric rungs
(1.25x apart): per system and pipeline a coarse session climbs every 4th rung, then a fine
session climbs every rung from at least 1.56x below the last coarse rung that held (two
rungs at 1.25x), each until its first unsustained step; every session is a fresh subprocess
and JVM. The runs are repeated ``--repeats`` times (3 by default) one after the other, each
with its own time budget; the section gives each run's capacity bounds, the median bound and
the spread, ratios as ranges over the runs, and a target as met only when every run met it
(``bench/capacity.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import query_floor
from bench.capacity import (
    Target,
    capacities,
    judge_targets,
    over_runs,
    render_capacities,
    render_ratios,
    render_readme_paragraph,
)
from bench.harness import Runner, StepResult, render_steps_table
from bench.ladder import EXTRA_PIPELINES, PIPELINES, RUNG_RATIO, run_ladder, rung_grid
from bench.peers import run_dstream, run_structured_socket
from bench.receivers import (
    run_spark_receivers,
    run_spark_receivers_connect,
    run_spark_receivers_nocache,
    run_spark_receivers_parquetspool,
    run_spark_receivers_wal,
    wal_status,
)
from bench.record import REPO_ROOT, Recording, RunInfo, Section, add_record_arguments
from bench.redis_positions import run_redis_no_positions, run_redis_positions
from bench.repeats import DEFAULT_REPEATS

__all__ = ["SECTION", "SYSTEMS", "TARGETS", "main", "render", "throughput_notes"]

SYSTEMS: dict[str, Runner] = {
    "dstream": run_dstream,
    "structured_socket": run_structured_socket,
    "spark_receivers": run_spark_receivers,  # receiver WAL off
    "spark_receivers_wal": run_spark_receivers_wal,  # receiver and driver WAL on
    "spark_receivers_nocache": run_spark_receivers_nocache,  # batch_cache=False
    # Arrow spool files read by mapInArrow, as before decision 0026
    "spark_receivers_parquetspool": run_spark_receivers_parquetspool,
    # through a Spark Connect server the child starts first (issue 34)
    "spark_receivers_connect": run_spark_receivers_connect,
    # fed through a redis-server, WAL on; issue 33's positions cost (bench/redis_positions.py)
    "redis_positions": run_redis_positions,
    "redis_no_positions": run_redis_no_positions,
}
"""Every system the ladder can run, by name."""
DEFAULT_SYSTEMS = ("dstream", "structured_socket", "spark_receivers", "spark_receivers_wal")
"""What ``make bench`` runs (``--systems spark_receivers_nocache`` adds the cache-off one)."""
FULL_GRID = rung_grid(10_000, 4_000_000)
"""10,000 to 4 M lines/s (400 MB/s on loopback), 1.25x apart: the line count of
spark-receivers sustains 1-3 M."""
FULL_STEP_S = 15.0  # fine sessions: the judge's last third is 5 batches
COARSE_STEP_S = 10.0  # coarse sessions only find where the fine one starts
FULL_BUDGET_S = 40 * 60.0  # per run of the ladder
QUICK_GRID = rung_grid(10_000, 20_000)
QUICK_STEP_S = 8.0
QUICK_BUDGET_S = 12 * 60.0  # 10 coarse sessions of 2 steps, no fine ones
INGEST_SYSTEMS = ("dstream", "spark_receivers")
"""By default the line count runs for these: PySpark's JVM receiver path against ours."""
TARGETS = (
    Target("two_action", "spark_receivers", "dstream", 3.0),
    Target("wordcount", "spark_receivers", "dstream", 5.0),
    Target("ingest", "spark_receivers", "dstream", 2.0),
    Target("two_action", "spark_receivers_wal", "spark_receivers", 0.9),
    Target("wordcount", "spark_receivers_wal", "spark_receivers", 0.9),
    Target("two_action", "spark_receivers_connect", "spark_receivers", 0.9),
)
"""Issue 20's capacity targets, issue 31's line count (``ingest``: at least twice DStream's),
and issue 34's (through Spark Connect, judged when the run has ``spark_receivers_connect``);
each is met only when, in every run, its whole ratio bound clears it. Issue 34's start-up
target is ``bench/cold_start.py``'s."""

NOTES = """\
Workload: a TCP line server (`LineSource`, the demo's) offers 100-byte lines (a 10-digit sequence
number, then words from a seeded 1,000-word vocabulary) at a fixed rate, paced every 10 ms,
open loop; its clock starts when the system's receiver connects. Pipelines, the same for
every system: `wordcount` splits lines into words, counts per word per 1 s batch and
collects the counts to the driver (one action); `two_action` runs `count()` and then that
word count on each batch (DStream: two output operations), as users write it; `ingest`
counts lines. Each session is a fresh subprocess and JVM (`local[4]`, 4 shuffle
partitions, UI off, 2 GB driver) that runs a warm-up job on sample lines, then is offered
rates one after the other on the same connection.

Rungs: one geometric grid for every system, each rung at most 1.25x the one below. Per
system and pipeline a **coarse** session climbs every 4th rung (10 s steps) until its first
unsustained step; a **fine** session (a fresh JVM) then climbs every rung (15 s steps) from
at least 1.56x below the last coarse rung that held (two rungs at 1.25x; the rungs up to
the coarse one are judged again), until its first unsustained step. Every session's first
step is its **warm-up**, at its first rung, shown as such in the steps table and never
judged: a fresh JVM's first batches can leave a backlog that has nothing to do with the
rate; that rung is judged by the next step. A capacity is reported as the bound `[highest
rung held, lowest rung failed)`. The whole ladder runs several times, one run after the other, each
with its own time budget: the tables give each run's bound, the **median bound**
(`[median held, median failed)`) and the **spread** of the runs; a ratio of two capacities
is a range, `[lo_a / hi_b, hi_a / lo_b]` in one run and from the lowest to the highest end
over the runs; a target is **met only when every run met it**.

A step is **sustained** only when all hold: processed ≥ 95 % of sent; sent ≥ 95 % of offered
(otherwise the receiver pushed back over TCP); the p50 processing time of the batches in the
second half of the step is below the batch interval; and in the last third of the step every
scheduling delay is below one interval and the delay is not growing (least-squares slope at
most 20 ms per s). A step is judged 3 s after it ends, from the batches completed by then; a
session stops after its first unsustained step. Structured Streaming has no scheduling
queue: its delay is how far past its trigger time a batch started because the previous batch
overran. Latency: per line, batch completion minus the line's send time (100 evenly spaced
lines of every batch in the second half). Sessions run one after the other, so a change in
the machine's background load hits them unequally: read each step with its `load 1m` and
`busy cores` columns."""


def throughput_notes(runs: Sequence[Sequence[StepResult]]) -> str:
    """What the runs found out about themselves: the WAL in effect, the machine's load."""
    parts = []
    for i, steps in enumerate(runs, 1):
        wal = wal_status(steps)
        if wal:
            label = f"run {i}: " if len(runs) > 1 else ""
            parts.append(f"WAL check, {label}measured in the run, not assumed:\n\n{wal}")
    loads = [
        float(load)
        for steps in runs
        for s in steps
        if isinstance(load := s.extra.get("load_1m"), int | float)
    ]
    if loads:
        parts.append(
            f"The 1-minute load average around the steps ranged {min(loads):.1f}-"
            f"{max(loads):.1f} (column `load 1m`)."
        )
    return "\n\n".join(parts)


def _steps(run: dict[str, Any]) -> list[StepResult]:
    return [StepResult.from_dict(s) for s in run["steps"]]


def render(data: dict[str, Any]) -> str:
    """The section's body from the raw data of its runs."""
    runs = [_steps(r) for r in data["runs"]]
    targets = [Target(**t) for t in data["targets"]]
    caps = over_runs([capacities(steps) for steps in runs])
    floor = data.get("query_floor_fails") or {}
    n = len(runs)
    spacing = data.get("spacing", RUNG_RATIO)
    out = [
        (
            f"**This run's rungs are {spacing:g}x apart** (`--spacing {spacing:g}`), not "
            f"{RUNG_RATIO:g}x as said above: the coarse session climbs {spacing**4:.2f}x per "
            f"step, and two systems that hold the same rung are bounded at >= "
            f"{1 / spacing:.2f}x of each other."
            if spacing != RUNG_RATIO
            else ""
        ),
        throughput_notes(runs),
        f"### Capacity (offered lines/s), {n} run{'s' if n != 1 else ''}",
        render_capacities(caps),
        "A bound is `[highest rung held, lowest rung failed)`; “not reached” means the system "
        "held up to its last rung (the top of the ladder, or the budget ended first); "
        "(noisy): a rung above the failed one held in another session of that run.",
        "### Targets",
        judge_targets(caps, targets, floor, data["grid"]) if targets else "(none)",
        "### Ratios, as ranges over the runs",
        render_ratios(caps) or "(one system only)",
        "### Every step",
    ]
    for i, (run, steps) in enumerate(zip(data["runs"], runs, strict=True), 1):
        cut = ""
        if run["skipped"]:
            items = ", ".join(f"{s}/{p}@{r:,}" for s, p, r in run["skipped"])
            cut = f"\n\nCut by the time budget (not run): {items}."
        out.append(
            f"<details><summary>Run {i}: {len(steps)} steps in "
            f"{run['elapsed_s'] / 60:.1f} min</summary>\n\n{render_steps_table(steps)}{cut}"
            "\n\n</details>"
        )
    return "\n\n".join(p for p in out if p)


def _write_readme_paragraph(data: dict[str, Any], info: RunInfo) -> None:
    """The README's performance paragraph, from the same runs (between its markers)."""
    caps = over_runs([capacities(_steps(r)) for r in data["runs"]])
    paragraph = render_readme_paragraph(
        caps,
        [Target(**t) for t in data["targets"]],
        cores=info.machine.cores,
        cpu_model=info.machine.cpu_model,
        when=dt.datetime.fromisoformat(info.started),
        floor_fails=data.get("query_floor_fails"),
        grid=data["grid"],
    )
    write_readme_paragraph(REPO_ROOT / "README.md", paragraph)
    print("wrote the performance paragraph of README.md from these runs")


def write_readme_paragraph(readme: Path, paragraph: str) -> None:
    """Replace the text between the README's ``<!-- bench:performance -->`` markers."""
    text = readme.read_text()
    begin, end = "<!-- bench:performance -->\n", "<!-- /bench:performance -->"
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"{readme} must hold {begin.strip()} ... {end} once each")
    head, rest = text.split(begin)
    tail = rest.split(end, 1)[1]
    tmp = readme.with_name(readme.name + ".tmp")
    tmp.write_text(f"{head}{begin}{paragraph.strip()}\n{end}{tail}")
    tmp.replace(readme)


SECTION = Section(
    name="throughput",
    module="bench.throughput",
    title="Throughput: word count over a TCP line server",
    render=render,
    about=NOTES,
    also_write=_write_readme_paragraph,
)


def _print_step(step: StepResult) -> None:
    print(render_steps_table([step]).splitlines()[-1], flush=True)


def run_once(
    systems: dict[str, Runner],
    *,
    grid: list[int],
    seconds: float,
    pipelines: list[str],
    budget_s: float,
    ingest_systems: list[str] | None,
    batch_interval_s: float,
    master: str,
    fine: bool,
    coarse_step_s: float | None,
    spacing: float = RUNG_RATIO,
    on_step: Callable[[StepResult], None] = _print_step,
) -> dict[str, Any]:
    """One run of the whole ladder (rungs ``spacing`` apart): its steps, what the budget
    cut, its length."""
    print(render_steps_table([]), flush=True)
    result = run_ladder(
        systems,
        grid,
        seconds,
        pipelines=pipelines,
        ingest_systems=ingest_systems,
        batch_interval_s=batch_interval_s,
        master=master,
        budget_s=budget_s,
        coarse_step_s=coarse_step_s,
        fine=fine,
        on_step=on_step,
        spacing=spacing,
    )
    return {
        "steps": [s.to_dict() for s in result.steps],
        "skipped": [list(x) for x in result.skipped],
        "elapsed_s": round(result.elapsed_s, 1),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.throughput", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 1 run, 2 rungs, 8 s steps, coarse only"
    )
    p.add_argument(
        "--repeats", type=int, help=f"runs of the whole ladder ({DEFAULT_REPEATS}; quick 1)"
    )
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"from {sorted(SYSTEMS)}")
    p.add_argument(
        "--pipelines", default=",".join(PIPELINES), help=",".join(PIPELINES + EXTRA_PIPELINES)
    )
    p.add_argument(
        "--ingest-systems",
        default=",".join(INGEST_SYSTEMS),
        help="systems that also run the ingest pipeline ('all' for every one)",
    )
    p.add_argument(
        "--spacing",
        type=float,
        help=f"ratio of one rung to the one below ({RUNG_RATIO}; > 1): two systems that hold "
        "the same rung are bounded at >= 1/spacing of each other, so a 0.9x target needs "
        "a spacing below 1.11",
    )
    p.add_argument("--lowest", type=int, help="the lowest rung (lines/s)")
    p.add_argument("--highest", type=int, help="the grid ends at the first rung at or above it")
    p.add_argument("--seconds", type=float, help="seconds per step of the fine sessions")
    p.add_argument("--budget-minutes", type=float, help="each run's time budget (40; quick 12)")
    p.add_argument("--master", default="local[4]")
    p.add_argument("--batch-interval", type=float, default=1.0)
    add_record_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    names = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(names) - set(SYSTEMS))
    if unknown:
        p.error(f"unknown systems {unknown}; known: {sorted(SYSTEMS)}")
    pipelines = [x for x in args.pipelines.split(",") if x]
    if not set(pipelines) <= set(PIPELINES + EXTRA_PIPELINES):
        known = ",".join(PIPELINES + EXTRA_PIPELINES)
        p.error(f"--pipelines must be from {known}; got {args.pipelines}")
    ingest_systems = (
        None if args.ingest_systems == "all" else [x for x in args.ingest_systems.split(",") if x]
    )
    if ingest_systems is not None and not set(ingest_systems) <= set(SYSTEMS):
        p.error(f"--ingest-systems must be from {sorted(SYSTEMS)} or 'all'")
    repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    if repeats < 1:
        p.error(f"--repeats must be >= 1, got {repeats}")
    grid = QUICK_GRID if args.quick else FULL_GRID
    spacing = args.spacing or RUNG_RATIO
    if spacing <= 1:
        p.error(f"--spacing must be > 1, got {spacing}")
    if args.lowest or args.highest or args.spacing:
        grid = rung_grid(args.lowest or grid[0], args.highest or grid[-1], spacing)
    seconds = args.seconds or (QUICK_STEP_S if args.quick else FULL_STEP_S)
    budget_s = (
        args.budget_minutes * 60
        if args.budget_minutes
        else (QUICK_BUDGET_S if args.quick else FULL_BUDGET_S)
    )
    # The floor ran 1 s batches on local[4] in this process: it speaks for these rungs only then.
    same_setup = args.batch_interval * 1000 == query_floor.INTERVAL_MS and args.master == "local[4]"
    floor_fails = query_floor.lowest_failing(query_floor.LAST_RESULTS) if same_setup else {}
    with Recording(SECTION, "python -m bench.throughput", argv, args) as rec:
        runs = []
        for i in range(repeats):
            print(f"\n### run {i + 1} of {repeats} of the ladder\n", flush=True)
            runs.append(
                run_once(
                    {n: SYSTEMS[n] for n in names},
                    grid=grid,
                    seconds=seconds,
                    pipelines=pipelines,
                    budget_s=budget_s,
                    ingest_systems=ingest_systems,
                    batch_interval_s=args.batch_interval,
                    master=args.master,
                    fine=not args.quick,
                    coarse_step_s=None if args.quick else COARSE_STEP_S,
                    spacing=spacing,
                )
            )
    data = {
        "grid": grid,
        "spacing": spacing,
        "step_s": seconds,
        "budget_s": budget_s,
        "batch_interval_s": args.batch_interval,
        "master": args.master,
        "targets": [asdict(t) for t in TARGETS],
        "query_floor_fails": floor_fails,
        "runs": runs,
    }
    caps = over_runs([capacities(_steps(r)) for r in runs])
    print("\nCapacity (offered lines/s):\n" + render_capacities(caps))
    print("\n" + judge_targets(caps, TARGETS, floor_fails, grid))
    print("\n" + (render_ratios(caps) or "(one system only: no ratios)"), flush=True)
    rec.finish(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
