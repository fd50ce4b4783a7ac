"""Every benchmark of ``make bench``, then the rate ladder: same machine, same run (issues 11, 20).

    python -m bench.run --quick                       # smoke: every section, ~25 min
    python -m bench.run                               # every section, 60-75 min
    python -m bench.run --sections throughput         # the ladder alone, <= 40 min
    python -m bench.run --sections throughput --systems dstream --pipelines two_action

Sections (``--sections``, all by default, run in this order): ``store`` (issue 3,
``bench/store_bench.py``), ``tracker`` (issues 5 and 20, ``bench/tracker_bench.py``: blocks
through the real endpoint), ``wal`` (issue 4, ``bench/wal_bench.py``), ``latency`` (issue 6,
``bench/latency_bench.py``), ``backpressure`` (issue 7, ``bench/backpressure.py``),
``replication`` (issue 18, ``bench/replication_bench.py``: two copies against one),
``observability`` (issue 21, ``bench/observability.py``: metrics + status page on vs off),
``cold_start`` (issue 20, ``bench/cold_start.py``: scheduling delay over time from a cold
start, with a plot), ``repeated_actions`` (issue 20, ``bench/repeated_actions.py``: first vs
second action, the empty batch), ``query_floor`` (issue 20, ``bench/query_floor.py``: the
ladder's batch query on rows already in Spark's memory, per rung), then ``throughput``
(issues 11 and 20, the rate ladder of ``bench/ladder.py``). The sections before the ladder
are bounded by their own lengths; the ladder has its own budget, ``--budget-minutes`` (40 by
default), shared out among its sessions.

The ladder gives every system the same geometric rungs (1.25x apart): per system and
pipeline a coarse session climbs every 4th rung, then a fine session climbs every rung from
the last coarse rung that held, each until its first unsustained step; capacities and their
ratios are printed as bounds. Pipelines: ``wordcount`` (one action), ``two_action``
(``count()`` and the word count on each batch), ``ingest`` (a line count, for
``--ingest-systems`` only). Each section is written to ``BENCHMARKS.md`` between its markers
(other sections are kept) with only what that run measured; raw results go to
``bench/out/``.

Adding a system
---------------
Register a function with the :class:`bench.harness.Runner` signature in :data:`SYSTEMS`::

    def run_spark_receivers(rates: Sequence[int], step_s: float,
                            batch_interval_s: float = 1.0, master: str = "local[4]", *,
                            pipeline: str = "wordcount", budget_s: float | None = None,
                            on_step=None) -> SessionResult: ...

It must start its own load (a stepped :class:`bench.loadgen.LineServer`) and Spark, run the
pipeline over the rates, and judge each step with
:func:`bench.harness.summarize_step`. The easy way is the subprocess protocol the peers use:
write a child pipeline ``pipeline(args: ChildArgs, recorder: BatchRecorder) -> stop`` (see
``bench/child.py`` and ``bench/peers.py``) that reports every batch's timings, scheduling
delay and line count to the recorder, serve it with ``child_main({"name": pipeline})`` under
``if __name__ == "__main__"`` in its module, and make the runner
``partial(run_child_session, "name", "module")`` (see :func:`bench.step.run_child_session`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from bench import (
    backpressure,
    cold_start,
    cpu_breakdown,
    latency_bench,
    observability,
    query_floor,
    repeated_actions,
    replication_bench,
    store_bench,
    tracker_bench,
    wal_bench,
)
from bench.harness import (
    LadderResult,
    Machine,
    Runner,
    StepResult,
    render_steps_table,
    save_raw,
    write_benchmarks_md,
)
from bench.ladder import (
    PIPELINES,
    Capacity,
    Target,
    capacities,
    judge_targets,
    render_capacities,
    render_ratios,
    render_readme_paragraph,
    render_throughput_section,
    run_ladder,
    rung_grid,
)
from bench.peers import run_dstream, run_structured_socket
from bench.receivers import (
    run_spark_receivers,
    run_spark_receivers_nocache,
    run_spark_receivers_wal,
    wal_status,
)
from bench.step import REPO_ROOT

SYSTEMS: dict[str, Runner] = {
    "dstream": run_dstream,
    "structured_socket": run_structured_socket,
    "spark_receivers": run_spark_receivers,  # receiver WAL off
    "spark_receivers_wal": run_spark_receivers_wal,  # receiver and driver WAL on
    "spark_receivers_nocache": run_spark_receivers_nocache,  # batch_cache=False
}
"""Every system the ladder can run, by name."""
DEFAULT_SYSTEMS = ("dstream", "structured_socket", "spark_receivers", "spark_receivers_wal")
"""What ``make bench`` runs (``--systems spark_receivers_nocache`` adds the cache-off one)."""

SECTIONS = (
    "store",
    "tracker",
    "wal",
    "latency",
    "backpressure",
    "replication",
    "observability",
    "cold_start",
    "repeated_actions",
    "query_floor",
    "cpu_breakdown",
    "throughput",
)
BEFORE_LADDER = {
    "store": store_bench,
    "tracker": tracker_bench,
    "wal": wal_bench,
    "latency": latency_bench,
    "backpressure": backpressure,
    "replication": replication_bench,
    "cold_start": cold_start,
    "repeated_actions": repeated_actions,
    "query_floor": query_floor,  # issue 20: what Spark alone needs for the batch query
    "observability": observability,  # issue 21: metrics + status page on vs off
    "cpu_breakdown": cpu_breakdown,  # issue 31: CPU per process and stage, flame graphs
}
FULL_GRID = rung_grid(10_000, 4_000_000)
"""10,000 to 4 M lines/s (400 MB/s on loopback), 1.25x apart: the line count of
spark-receivers sustains 2-3 M."""
FULL_STEP_S = 15.0  # fine sessions: the judge's last third is 5 batches
COARSE_STEP_S = 10.0  # coarse sessions only find where the fine one starts
FULL_BUDGET_S = 40 * 60.0
QUICK_GRID = rung_grid(10_000, 20_000)
QUICK_STEP_S = 8.0
QUICK_BUDGET_S = 12 * 60.0  # 10 coarse sessions of 2 steps, no fine ones
INGEST_SYSTEMS = ("dstream", "spark_receivers")
"""By default the line count runs for these: PySpark's JVM receiver path against ours."""
TARGETS = (
    Target("two_action", "spark_receivers", "dstream", 3.0),
    Target("wordcount", "spark_receivers", "dstream", 5.0),
    Target("two_action", "spark_receivers_wal", "spark_receivers", 0.9),
    Target("wordcount", "spark_receivers_wal", "spark_receivers", 0.9),
)
"""Issue 20's capacity targets; each is met only when its whole ratio bound clears it."""

NOTES = """\
Workload: a TCP line server (`bench/loadgen.py`) offers 100-byte lines (a 10-digit sequence
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
the last coarse rung that held (its first step, where the fresh JVM warms up, judged again),
until its first unsustained step. A capacity is
reported as the bound `[highest rung held, lowest rung failed)`, and a ratio of two
capacities as `[lo_a / hi_b, hi_a / lo_b]`.

A step is **sustained** only when all hold: processed ≥ 95 % of sent; sent ≥ 95 % of offered
(otherwise the receiver pushed back over TCP); the p50 processing time of the batches in the
second half of the step is below the batch interval; and in the last third of the step every
scheduling delay is below one interval and the delay is not growing (least-squares slope at
most 20 ms per s). A step is judged 3 s after it ends, from the batches completed by then; a
session stops after its first unsustained step. Structured Streaming has no scheduling
queue: its delay is how far past its trigger time a batch started because the previous batch
overran. Latency: per line, batch completion minus the line's send time (100 evenly spaced
lines of every batch in the second half). Sessions run one after the other, so a change in
the machine's background load hits them unequally: read each step with its `load 1m`
column."""


def section_argv(section: str, *, quick: bool, output: str, no_write: bool) -> list[str]:
    """The command line ``bench.run`` gives a benchmark that runs before the ladder."""
    if section == "store":
        argv = ["--seconds", "1" if quick else "5", "--pipeline-seconds", "10" if quick else "30"]
    elif section == "tracker":
        # Offered at the target and above it: a count at exactly the target's offer falls
        # either side of it by noise (4,972-5,398 blocks/s in seven runs of 2026-11-24).
        argv = ["--supervisors", "1000", "--rates", "5,6", "--seconds", "5" if quick else "20"]
    elif section in BEFORE_LADDER:
        argv = ["--quick"] if quick else []
    else:
        raise ValueError(f"section must be one of {sorted(BEFORE_LADDER)}, got {section!r}")
    argv += ["--output", output]
    return [*argv, "--no-write"] if no_write else argv


def throughput_notes(steps: list[StepResult], end_load: Sequence[float] | None = None) -> str:
    """NOTES plus what this run found out about itself: WAL in effect, machine load.

    ``end_load``: the load averages when the run ended (left out when unknown).
    """
    parts = [NOTES]
    wal = wal_status(steps)
    if wal:
        parts.append("WAL check (measured in the run, not assumed):\n\n" + wal)
    loads = [s.extra["load_1m"] for s in steps if isinstance(s.extra.get("load_1m"), int | float)]
    if loads:
        parts.append(
            f"The machine is shared: the 1-minute load average around the steps ranged "
            f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores (column `load 1m`"
            + (
                "; at the end of the run it was " + ", ".join(f"{x:.2f}" for x in end_load)
                if end_load
                else ""
            )
            + ")."
        )
    return "\n\n".join(parts)


def _print_step(step: StepResult) -> None:
    print(render_steps_table([step]).splitlines()[-1], flush=True)


def run(
    systems: dict[str, Runner],
    *,
    grid: list[int],
    seconds: float,
    pipelines: list[str],
    budget_s: float,
    ingest_systems: list[str] | None = None,
    batch_interval_s: float = 1.0,
    master: str = "local[4]",
    coarse_step_s: float | None = None,
    fine: bool = True,
    on_step: Callable[[StepResult], None] = _print_step,
) -> LadderResult:
    print(render_steps_table([]), flush=True)
    return run_ladder(
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
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 2 rungs, 8 s steps, coarse only"
    )
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"from {','.join(SECTIONS)}")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"from {sorted(SYSTEMS)}")
    p.add_argument("--pipelines", default=",".join(PIPELINES), help=",".join(PIPELINES))
    p.add_argument(
        "--ingest-systems",
        default=",".join(INGEST_SYSTEMS),
        help="systems that also run the ingest pipeline ('all' for every one)",
    )
    p.add_argument("--lowest", type=int, help="the lowest rung (lines/s)")
    p.add_argument("--highest", type=int, help="the grid ends at the first rung at or above it")
    p.add_argument("--seconds", type=float, help="seconds per step of the fine sessions")
    p.add_argument("--budget-minutes", type=float, help="the ladder's time budget")
    p.add_argument("--master", default="local[4]")
    p.add_argument("--batch-interval", type=float, default=1.0)
    p.add_argument("--output", default=str(REPO_ROOT / "BENCHMARKS.md"))
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument(
        "--from-raw",
        metavar="JSON",
        help="run nothing: rewrite the throughput section from a run's raw file in bench/out",
    )
    args = p.parse_args(argv)
    if args.from_raw:
        return rewrite_from_raw(Path(args.from_raw), args.output)

    sections = [x for x in args.sections.split(",") if x]
    if not set(sections) <= set(SECTIONS):
        p.error(f"--sections must be from {','.join(SECTIONS)}; got {args.sections}")
    names = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(names) - set(SYSTEMS))
    if unknown:
        p.error(f"unknown systems {unknown}; known: {sorted(SYSTEMS)}")
    pipelines = [x for x in args.pipelines.split(",") if x]
    ingest_systems = (
        None if args.ingest_systems == "all" else [x for x in args.ingest_systems.split(",") if x]
    )
    if ingest_systems is not None and not set(ingest_systems) <= set(SYSTEMS):
        p.error(f"--ingest-systems must be from {sorted(SYSTEMS)} or 'all'")
    if not set(pipelines) <= set(PIPELINES):
        p.error(f"--pipelines must be from {','.join(PIPELINES)}; got {args.pipelines}")
    grid = QUICK_GRID if args.quick else FULL_GRID
    if args.lowest or args.highest:
        grid = rung_grid(args.lowest or grid[0], args.highest or grid[-1])
    seconds = args.seconds or (QUICK_STEP_S if args.quick else FULL_STEP_S)
    budget_s = (
        args.budget_minutes * 60
        if args.budget_minutes
        else (QUICK_BUDGET_S if args.quick else FULL_BUDGET_S)
    )

    t0 = time.monotonic()
    failed: list[str] = []
    for section, module in BEFORE_LADDER.items():
        if section in sections:
            print(f"\n## {section}\n", flush=True)
            argv_ = section_argv(
                section, quick=args.quick, output=args.output, no_write=args.no_write
            )
            try:
                code = module.main(argv_)
            except Exception:  # one section's failure must not cost the others their run
                traceback.print_exc()
                code = 1
            if code:
                failed.append(section)
                print(f"section {section} FAILED (its BENCHMARKS.md section is unchanged)")
    if failed:
        print(f"\nfailed sections: {', '.join(failed)}", flush=True)
    if "throughput" not in sections:
        return 1 if failed else 0
    print(f"\nsections before the ladder took {(time.monotonic() - t0) / 60:.1f} min", flush=True)

    machine = Machine.detect()
    when = dt.datetime.now(dt.UTC)
    command = "python -m bench.run " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"\n## throughput\n\n# {command}\n{machine.to_markdown()}\n", flush=True)
    result = run(
        {n: SYSTEMS[n] for n in names},
        grid=grid,
        seconds=seconds,
        pipelines=pipelines,
        budget_s=budget_s,
        ingest_systems=ingest_systems,
        batch_interval_s=args.batch_interval,
        master=args.master,
        coarse_step_s=None if args.quick else COARSE_STEP_S,
        fine=not args.quick,
    )
    caps = capacities(result.steps)
    # The floor ran 1 s batches on local[4]: it speaks for the ladder's rungs only then.
    same_setup = args.batch_interval * 1000 == query_floor.INTERVAL_MS and args.master == "local[4]"
    floor_fails = (
        query_floor.lowest_failing(query_floor.LAST_RESULTS)
        if "query_floor" in sections and same_setup
        else {}
    )
    print("\nCapacity (offered lines/s):\n" + render_capacities(caps))
    print("\n" + judge_targets(caps, TARGETS, floor_fails, grid))
    print("\n" + (render_ratios(caps) or "(one system only: no ratios)"), flush=True)
    if result.skipped:
        minutes = budget_s / 60
        print(f"\nCut by the time budget ({minutes:.1f} min for this section): {result.skipped}")
    wal = wal_status(result.steps)
    if wal:
        print("\n" + wal)

    steps = [s.to_dict() for s in result.steps]
    report = {"command": command, "machine": asdict(machine), "steps": steps}
    end_load = os.getloadavg()
    report |= {"when": when.isoformat(), "rates": grid, "elapsed_s": result.elapsed_s}
    report |= {"end_load": end_load, "query_floor_fails": floor_fails}
    raw = save_raw("throughput", when, {**report, "skipped": result.skipped})
    if not args.no_write:
        section = render_throughput_section(
            result,
            machine=machine,
            command=command,
            when=when,
            notes=throughput_notes(result.steps, end_load),
            targets=TARGETS,
            floor_fails=floor_fails,
        )
        write_benchmarks_md(args.output, {"throughput": section})
        print(f"\nwrote section 'throughput' of {args.output}; raw steps in {raw}")
        if Path(args.output).resolve() == (REPO_ROOT / "BENCHMARKS.md").resolve():
            _write_readme_paragraph(caps, machine, when, floor_fails, grid)
            print("wrote the performance paragraph of README.md from this run")
    if failed:
        print(f"\nfailed sections: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


def _write_readme_paragraph(
    caps: list[Capacity],
    machine: Machine,
    when: dt.datetime,
    floor_fails: dict[str, int] | None,
    grid: list[int],
) -> None:
    paragraph = render_readme_paragraph(
        caps, TARGETS, machine=machine, when=when, floor_fails=floor_fails, grid=grid
    )
    write_benchmarks_md(REPO_ROOT / "README.md", {"performance": paragraph})


def rewrite_from_raw(raw: Path, output: str) -> int:
    """Rewrite the throughput section of ``output`` from the raw file of an earlier run."""
    data = json.loads(raw.read_text())
    missing = [k for k in ("when", "rates", "elapsed_s", "machine", "steps") if k not in data]
    if missing:
        print(f"{raw} lacks {missing}: it was written before --from-raw existed", file=sys.stderr)
        return 2
    machine = data["machine"]
    result = LadderResult(
        rates=data["rates"],
        steps=[StepResult.from_dict(s) for s in data["steps"]],
        skipped=[tuple(x) for x in data["skipped"]],
        elapsed_s=data["elapsed_s"],
    )
    ran_on = Machine(**{**machine, "load_average": tuple(machine["load_average"])})
    when = dt.datetime.fromisoformat(data["when"])
    section = render_throughput_section(
        result,
        machine=ran_on,
        command=data["command"],
        when=when,
        notes=throughput_notes(result.steps, data.get("end_load")),
        targets=TARGETS,
        floor_fails=data.get("query_floor_fails"),
    )
    write_benchmarks_md(output, {"throughput": section})
    print(f"wrote section 'throughput' of {output} from {raw}")
    if Path(output).resolve() == (REPO_ROOT / "BENCHMARKS.md").resolve():
        caps = capacities(result.steps)
        _write_readme_paragraph(caps, ran_on, when, data.get("query_floor_fails"), result.rates)
        print(f"wrote the performance paragraph of README.md from {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
