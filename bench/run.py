"""Throughput rate ladder: every system, same machine, same run, same load (issue 11).

    python -m bench.run --quick                       # smoke: every section
    python -m bench.run                               # every section, ~30 min
    python -m bench.run --sections throughput         # the ladder alone, <= 15 min
    python -m bench.run --sections throughput --systems dstream --pipelines wordcount,ingest

Sections (``--sections``, all by default, run in this order): ``store`` (issue 3,
``bench/store_bench.py``), ``tracker`` (issue 5, ``bench/tracker_bench.py``), ``wal``
(issue 4, ``bench/wal_bench.py``), ``latency`` (issue 6, ``bench/latency_bench.py``),
``backpressure`` (issue 7, ``bench/backpressure.py``), ``observability`` (issue 21,
``bench/observability.py``),
then ``throughput`` (issue 11, the rate ladder below). The sections before the ladder are
bounded by their own lengths; the ladder has its own budget, ``--budget-minutes`` (15 by
default), shared out among its sessions (see :func:`bench.harness.run_ladder`).

The ladder runs one session per system and pipeline: one JVM that is offered the rates one
after the other (``--seconds`` each) and judged step by step while it runs, until its first
unsustained step. The ``ingest`` pipeline (a line count, which separates a system's receive
path from Spark's processing) runs for ``--ingest-systems`` only.
Each writes its own section of ``BENCHMARKS.md`` (other sections are kept) and prints its
tables; raw results go to ``bench/out/``.

Adding a system
---------------
Register a function with the :class:`bench.harness.Runner` signature in :data:`SYSTEMS`::

    def run_spark_receivers(rates: Sequence[int], step_s: float,
                            batch_interval_s: float = 1.0, master: str = "local[4]", *,
                            ingest_only: bool = False, budget_s: float | None = None,
                            on_step=None) -> SessionResult: ...

It must start its own load (a stepped :class:`bench.loadgen.LineServer`) and Spark, run the
word count (``ingest_only``: a line count) over the rates, and judge each step with
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
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from bench import backpressure, latency_bench, observability, store_bench, tracker_bench, wal_bench
from bench.harness import (
    LadderResult,
    Machine,
    Runner,
    StepResult,
    headlines,
    render_ratios,
    render_steps_table,
    render_throughput_section,
    run_ladder,
    write_benchmarks_md,
)
from bench.peers import run_dstream, run_structured_socket
from bench.receivers import run_spark_receivers, run_spark_receivers_wal, wal_status
from bench.step import REPO_ROOT

SYSTEMS: dict[str, Runner] = {
    "dstream": run_dstream,
    "structured_socket": run_structured_socket,
    "spark_receivers": run_spark_receivers,  # receiver WAL off
    "spark_receivers_wal": run_spark_receivers_wal,  # receiver and driver WAL on
}
"""Every system the ladder can run, by name."""

SECTIONS = ("store", "tracker", "wal", "latency", "backpressure", "observability", "throughput")
BEFORE_LADDER = {
    "store": store_bench,
    "tracker": tracker_bench,
    "wal": wal_bench,
    "latency": latency_bench,
    "backpressure": backpressure,
    "observability": observability,  # issue 21: metrics + status page on vs off
}
FULL_RATES = [
    10_000, 25_000, 50_000, 100_000, 200_000, 400_000, 500_000, 600_000, 800_000,
    1_000_000, 1_500_000, 2_000_000, 3_000_000,
]  # fmt: skip
"""Up to 3 M lines/s (300 MB/s on loopback): the line count of spark-receivers sustains 2 M."""
FULL_STEP_S = 15.0
FULL_BUDGET_S = 15 * 60.0
QUICK_RATES = [10_000, 50_000]
QUICK_STEP_S = 10.0
QUICK_BUDGET_S = 6 * 60.0  # 6 sessions of 2 steps: each needs SESSION_OVERHEAD_S + a step
INGEST_SYSTEMS = ("dstream", "spark_receivers")
"""By default the line count runs for these: PySpark's JVM receiver path against ours."""

NOTES = """\
Workload: a TCP line server (`bench/loadgen.py`) offers 100-byte lines (a 10-digit sequence
number, then words from a seeded 1,000-word vocabulary) at a fixed rate, paced every 10 ms,
open loop; its clock starts when the system's receiver connects. Each system splits lines
into words, counts per word per 1 s batch and collects the counts to the driver (`ingest`:
counts lines only). Each system and pipeline runs as one session: a fresh subprocess and JVM
(`local[4]`, 4 shuffle partitions, UI off, 2 GB driver) that runs a warm-up job on sample
lines, then is offered the ladder's rates one after the other on the same connection.

A step is **sustained** when: processed ≥ 95 % of sent; sent ≥ 95 % of offered (otherwise
the receiver pushed back over TCP); and in the steady-state window (the second half of the
step) every batch's scheduling delay stays under one batch interval. A step is judged 3 s
after it ends (while the next one runs), from the batches completed by then; a session
stops after its first unsustained step. Structured Streaming
has no scheduling queue: its delay is how far past its trigger time a batch started because
the previous batch overran (what Spark logs as "Current batch is falling behind").
Latency: per line, batch completion minus the line's send time (100 evenly spaced lines
of every batch in the steady-state window).
Sessions run one after the other, so a change in the machine's background load hits them
unequally: read each step with its `load 1m` column."""


def section_argv(section: str, *, quick: bool, output: str, no_write: bool) -> list[str]:
    """The command line ``bench.run`` gives a benchmark that runs before the ladder."""
    if section == "store":
        argv = ["--seconds", "1" if quick else "5", "--pipeline-seconds", "10" if quick else "30"]
    elif section == "tracker":
        argv = ["--supervisors", "1000", "--rates", "5", "--seconds", "5" if quick else "20"]
    elif section in ("wal", "latency", "backpressure", "observability"):
        argv = ["--quick"] if quick else []
    else:
        raise ValueError(f"section must be one of {sorted(BEFORE_LADDER)}, got {section!r}")
    argv += ["--output", output]
    return [*argv, "--no-write"] if no_write else argv


def throughput_notes(
    steps: list[StepResult], end_load: Sequence[float] | None = None
) -> str:
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
    analysis = REPO_ROOT / "bench" / "notes" / "throughput.md"  # hand-written, kept across runs
    if analysis.exists():
        parts.append(analysis.read_text().strip())
    return "\n\n".join(parts)


def _print_step(step: StepResult) -> None:
    print(render_steps_table([step]).splitlines()[-1], flush=True)


def run(
    systems: dict[str, Runner],
    *,
    rates: list[int],
    seconds: float,
    pipelines: list[str],
    budget_s: float,
    ingest_systems: list[str] | None = None,
    batch_interval_s: float = 1.0,
    master: str = "local[4]",
    on_step: Callable[[StepResult], None] = _print_step,
) -> LadderResult:
    print(render_steps_table([]), flush=True)
    return run_ladder(
        systems,
        rates,
        seconds,
        pipelines=pipelines,
        ingest_systems=ingest_systems,
        batch_interval_s=batch_interval_s,
        master=master,
        budget_s=budget_s,
        on_step=on_step,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 rates, 10 s steps")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"from {','.join(SECTIONS)}")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"from {sorted(SYSTEMS)}")
    p.add_argument("--pipelines", default="wordcount,ingest", help="wordcount,ingest")
    p.add_argument(
        "--ingest-systems",
        default=",".join(INGEST_SYSTEMS),
        help="systems that also run the ingest pipeline ('all' for every one)",
    )
    p.add_argument("--rates", help="comma-separated lines/s (overrides the ladder)")
    p.add_argument("--seconds", type=float, help="seconds per step")
    p.add_argument("--budget-minutes", type=float, help="the ladder's time budget")
    p.add_argument("--master", default="local[4]")
    p.add_argument("--batch-interval", type=float, default=1.0)
    p.add_argument("--output", default=str(REPO_ROOT / "BENCHMARKS.md"))
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument(
        "--from-raw",
        metavar="JSON",
        help="run nothing: rewrite the throughput section from a run's raw file in bench/out "
        "(after editing bench/notes/throughput.md)",
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
    if not set(pipelines) <= {"wordcount", "ingest"}:
        p.error(f"--pipelines must be from wordcount,ingest; got {args.pipelines}")
    rates = (
        [int(r) for r in args.rates.split(",")]
        if args.rates
        else (QUICK_RATES if args.quick else FULL_RATES)
    )
    seconds = args.seconds or (QUICK_STEP_S if args.quick else FULL_STEP_S)
    budget_s = (
        args.budget_minutes * 60
        if args.budget_minutes
        else (QUICK_BUDGET_S if args.quick else FULL_BUDGET_S)
    )

    t0 = time.monotonic()
    for section, module in BEFORE_LADDER.items():
        if section in sections:
            print(f"\n## {section}\n", flush=True)
            module.main(
                section_argv(section, quick=args.quick, output=args.output, no_write=args.no_write)
            )
    if "throughput" not in sections:
        return 0
    print(f"\nsections before the ladder took {(time.monotonic() - t0) / 60:.1f} min", flush=True)

    machine = Machine.detect()
    when = dt.datetime.now(dt.UTC)
    command = "python -m bench.run " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"\n## throughput\n\n# {command}\n{machine.to_markdown()}\n", flush=True)
    result = run(
        {n: SYSTEMS[n] for n in names},
        rates=rates,
        seconds=seconds,
        pipelines=pipelines,
        budget_s=budget_s,
        ingest_systems=ingest_systems,
        batch_interval_s=args.batch_interval,
        master=args.master,
    )
    heads = headlines(result)
    print("\nHighest sustained offered rate (lines/s):")
    for h in heads:
        print(f"  {h.system:24} {h.pipeline:10} {h.label()}")
    print("\n" + (render_ratios(heads) or "(one system only: no ratios)"), flush=True)
    if result.skipped:
        minutes = budget_s / 60
        print(f"\nCut by the time budget ({minutes:.1f} min for this section): {result.skipped}")
    wal = wal_status(result.steps)
    if wal:
        print("\n" + wal)

    out_dir = REPO_ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"throughput-{when:%Y%m%dT%H%M%SZ}.json"
    steps = [s.to_dict() for s in result.steps]
    report = {"command": command, "machine": asdict(machine), "steps": steps}
    end_load = os.getloadavg()
    report |= {"when": when.isoformat(), "rates": rates, "elapsed_s": result.elapsed_s}
    report |= {"end_load": end_load}
    raw.write_text(json.dumps({**report, "skipped": result.skipped}, indent=1))
    if not args.no_write:
        section = render_throughput_section(
            result,
            machine=machine,
            command=command,
            when=when,
            notes=throughput_notes(result.steps, end_load),
        )
        write_benchmarks_md(args.output, {"throughput": section})
        print(f"\nwrote section 'throughput' of {args.output}; raw steps in {raw}")
    return 0


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
    section = render_throughput_section(
        result,
        machine=Machine(**{**machine, "load_average": tuple(machine["load_average"])}),
        command=data["command"],
        when=dt.datetime.fromisoformat(data["when"]),
        notes=throughput_notes(result.steps, data.get("end_load")),
    )
    write_benchmarks_md(output, {"throughput": section})
    print(f"wrote section 'throughput' of {output} from {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
