"""Every benchmark of ``make bench``, one after the other, on the same machine (issues 11, 20, 30).

    python -m bench.run                                # every section; ~2.1-3.2 h (see below)
    python -m bench.run --quick                        # smoke: every section short, ~25 min
    python -m bench.run --sections tracker --repeats 5
    python -m bench.run --sections throughput --systems dstream --pipelines two_action
    python -m bench.run --from-raw bench/results/tracker-<UTC start>.json.gz

Sections (``--sections``, all by default, run in this order): ``store`` (issue 3,
``bench/store_bench.py``), ``tracker`` (issues 5 and 20, ``bench/tracker_bench.py``: blocks
through the real endpoint), ``wal`` (issue 4, ``bench/wal_bench.py``), ``latency`` (issue 6,
``bench/latency_bench.py``), ``backpressure`` (issue 7, ``bench/backpressure.py``),
``replication`` (issue 18, ``bench/replication_bench.py``: two copies against one),
``cold_start`` (issue 20, ``bench/cold_start.py``), ``repeated_actions`` (issue 20,
``bench/repeated_actions.py``), ``query_floor`` (issue 20, ``bench/query_floor.py``: the
ladder's batch query on rows already in Spark's memory), ``observability`` (issue 21,
``bench/observability.py``: a ladder per mode, metrics + status page on vs off),
``cpu_breakdown`` (issue 31, ``bench/cpu_breakdown.py``: CPU-seconds per million lines by
process, ours and DStream's at one rate, with flame graphs), then ``throughput`` (issues 11
and 20, ``bench/throughput.py``: the rate ladder of every system).

The ladders (``observability``, ``throughput``) and the tracker run ``--repeats`` times (3;
``--quick``: 1) in fresh processes and JVMs, and report the median, the spread and a target
as met only when every run met it (``bench/repeats.py``). The ladder's options
(``--systems``, ``--pipelines``, ``--seconds``, ``--budget-minutes`` ...) are passed on to
``bench.throughput``.

Every section is a run of its own module, written by ``bench/record.py``: the section of
BENCHMARKS.md between its markers (replaced whole; nothing outside the markers changes),
headed by the commit, the UTC start and end, the machine and its load, and its raw results
in ``bench/results/`` (committed). A ``--quick`` run writes ``bench/out/BENCHMARKS.md`` and
``bench/out/`` instead: smoke figures never land in the records. ``--from-raw FILE`` runs
nothing and renders the section of a raw file again.

How long ``make bench`` takes, by the code's own lengths (each JVM adds ~20-45 s of start
and warm-up on a quiet 2-core machine): store 3-3.5 min (3 forms x 5 s, then 3 x 30 s
through Spark); tracker 4.5-6 min (3 runs x 2 rates x a 20 s window and ~25-40 s of
processes starting and registering); wal 4-5 min; latency ~2-2.5 min (3 cases x 30 s);
backpressure 4.5-6 min (2 x 120 s and the drain); replication 7-8 min (4 x 10 s of
store(one), 4 x 60 s word counts on local-cluster); cold_start 2.5-4 min; repeated_actions
~2-2.5 min; query_floor 6-8 min (9 rungs x 2 queries x 2 forms x 9 runs); observability
14-25 min (3 rounds x 2 sessions of a warm-up step and up to 12 rungs x 15 s);
cpu_breakdown 4.5-6 min (2 systems x 2 pipelines x 30 s, Spark alone, the profiles);
throughput 78-120 min (3 runs of the ladder, each within its 40-minute budget; the run of
2026-11-24 took 26 min). In all about 2.1-3.2 hours.

Adding a section
----------------
A module ``bench/my_bench.py`` with a :class:`bench.record.Section` (its name, title and a
``render(data) -> str`` from the run's raw data alone) and a ``main(argv)`` that parses its
options with :func:`bench.record.add_record_arguments` and measures inside a
:class:`bench.record.Recording`::

    SECTION = Section("my_bench", "bench.my_bench", "What it measures", render)

    def main(argv=None):
        p = argparse.ArgumentParser(prog="python -m bench.my_bench")
        p.add_argument("--quick", action="store_true")
        add_record_arguments(p)
        args = p.parse_args(argv)
        with Recording(SECTION, "python -m bench.my_bench", argv, args) as rec:
            data = measure(args)                 # summaries and per-step figures, JSON
        rec.finish(data)
        return 0

then its name and module in :data:`SECTIONS`. The header, the raw file, the markers and
``--from-raw`` come with it.

Adding a system to the ladder: see ``bench/throughput.py`` (:data:`SYSTEMS`) and
:class:`bench.harness.Runner`; the easy way is the subprocess protocol of
``bench/child.py`` and :func:`bench.step.run_child_session`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

from bench.record import rerender, shown
from bench.repeats import DEFAULT_REPEATS

SECTIONS = {
    "store": "bench.store_bench",
    "tracker": "bench.tracker_bench",
    "wal": "bench.wal_bench",
    "latency": "bench.latency_bench",
    "backpressure": "bench.backpressure",
    "replication": "bench.replication_bench",
    "cold_start": "bench.cold_start",
    "repeated_actions": "bench.repeated_actions",
    "query_floor": "bench.query_floor",  # before the ladder: its targets read the floor
    "observability": "bench.observability",
    "cpu_breakdown": "bench.cpu_breakdown",  # before the ladder, after the floor it is read against
    "throughput": "bench.throughput",
}
"""Every section of ``make bench``, by name, in the order they run."""
REPEATED = ("tracker", "observability", "throughput")
"""The sections that take ``--repeats``."""
LADDER_OPTIONS = (
    "systems",
    "pipelines",
    "ingest_systems",
    "lowest",
    "highest",
    "seconds",
    "budget_minutes",
    "master",
    "batch_interval",
)
"""``bench.run`` options passed on to ``bench.throughput`` when given."""


def section_argv(
    section: str,
    *,
    quick: bool = False,
    repeats: int | None = None,
    output: str | None = None,
    no_write: bool = False,
    results_dir: str | None = None,
    ladder: dict[str, object] | None = None,
) -> list[str]:
    """The command line ``bench.run`` gives one section's ``main``."""
    if section not in SECTIONS:
        raise ValueError(f"section must be one of {list(SECTIONS)}, got {section!r}")
    argv = ["--quick"] if quick else []
    if repeats is not None and section in REPEATED:
        argv += ["--repeats", str(repeats)]
    if section == "throughput":
        for key, value in (ladder or {}).items():
            if value is not None:
                argv += [f"--{key.replace('_', '-')}", str(value)]
    if output:
        argv += ["--output", output]
    if results_dir:
        argv += ["--results-dir", results_dir]
    return [*argv, "--no-write"] if no_write else argv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.run", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="smoke run of every section")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"from {','.join(SECTIONS)}")
    p.add_argument(
        "--repeats",
        type=int,
        help=f"runs of the tracker and of each ladder ({DEFAULT_REPEATS}; --quick 1)",
    )
    p.add_argument("--output", help="the Markdown file (BENCHMARKS.md; --quick bench/out/...)")
    p.add_argument("--results-dir", help="where raw files go (bench/results; --quick bench/out)")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument(
        "--from-raw",
        metavar="FILE",
        help="run nothing: render the section of a raw file (bench/results/*.json.gz) again",
    )
    ladder = p.add_argument_group("the ladder's options (bench.throughput)")
    ladder.add_argument("--systems")
    ladder.add_argument("--pipelines")
    ladder.add_argument("--ingest-systems")
    ladder.add_argument("--lowest", type=int)
    ladder.add_argument("--highest", type=int)
    ladder.add_argument("--seconds", type=float, help="per step of the fine sessions")
    ladder.add_argument("--budget-minutes", type=float, help="each run's time budget")
    ladder.add_argument("--master")
    ladder.add_argument("--batch-interval", type=float)
    args = p.parse_args(argv)
    if args.from_raw:
        try:
            target, text = rerender(
                Path(args.from_raw),
                Path(args.output) if args.output else None,
                write=not args.no_write,
            )
        except ValueError as e:
            print(f"--from-raw: {e}", file=sys.stderr)
            return 2
        if args.no_write:
            print(text)
        else:
            print(f"wrote the section of {args.from_raw} into {shown(target)}")
        return 0
    sections = [x for x in args.sections.split(",") if x]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        p.error(f"--sections must be from {','.join(SECTIONS)}; got {unknown}")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    ladder_args = {k: getattr(args, k) for k in LADDER_OPTIONS}

    t0 = time.monotonic()
    failed: list[str] = []
    for section in [s for s in SECTIONS if s in sections]:
        print(f"\n## {section}\n", flush=True)
        started = time.monotonic()
        sub_argv = section_argv(
            section,
            quick=args.quick,
            repeats=args.repeats,
            output=args.output,
            no_write=args.no_write,
            results_dir=args.results_dir,
            ladder=ladder_args,
        )
        try:
            code = importlib.import_module(SECTIONS[section]).main(sub_argv)
        except Exception:
            traceback.print_exc()
            code = 1
        took = (time.monotonic() - started) / 60
        if code:
            failed.append(section)
            print(f"section {section} FAILED after {took:.1f} min (its section is unchanged)")
        else:
            print(f"section {section} took {took:.1f} min", flush=True)
    print(f"\nall sections took {(time.monotonic() - t0) / 60:.1f} min", flush=True)
    if failed:
        print(f"failed sections: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
