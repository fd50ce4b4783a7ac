"""Spark alone: the ladder's batch query on rows already in Spark's memory, per batch size.

    python -m bench.query_floor                       # ~8 minutes, writes the section
    python -m bench.query_floor --quick               # smoke: 3 rungs, 3 runs each
    python -m bench.query_floor --rungs 346000 --runs 2 --warm-up 2 --no-write

What no ingest path can beat on this machine (issue 20): the ladder's two DataFrame
pipelines, the word count (``explode(split)`` → ``groupBy`` → ``collect``) and ``count()``
then the word count, run by Spark on a batch of the ladder's 100-byte lines that is already
in Spark's memory, in 4 partitions (``local[4]``, the ladder's settings), with no receiver,
no load generator and no stream running. Batch sizes are the ladder's rungs (1 s batches,
so a rung of R lines/s is a batch of R lines). Two forms of "in memory", each measured, a
rung fitting when either form does: the DataFrame cache (``cache()``, what a batch's rows
become after its first action) and Spark's own rows (``localCheckpoint()``). The JVM is
warmed up first (a word count repeated on a million lines), then per rung and form: two
untimed runs, then ``--runs`` timed runs of each pipeline. The machine's busy cores over
the timed runs (all processes, ``/proc/stat``) times their wall time gives the CPU one
batch's query takes.

Reading: a rung whose query alone takes the whole interval (p50 ≥ 1 s) cannot be held by
any system that must also receive the lines in that second on the same cores; nor can one
whose query alone takes 2 core-seconds (both cores for the whole interval).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.child import local_session
from bench.harness import CpuSampler
from bench.ladder import rung_grid
from bench.pipelines import two_action, word_count
from bench.record import Recording, Section, add_record_arguments, doc_tail
from spark_receivers.receivers.lines import BLOCK_LINES, LinePool

__all__ = [
    "LAST_RESULTS",
    "QUERIES",
    "SECTION",
    "fits",
    "lowest_failing",
    "main",
    "render",
    "warm_up",
]

INTERVAL_MS = 1000.0
CORES_PER_INTERVAL = float(os.cpu_count() or 2)
FORMS = ("cache", "checkpoint")
DEFAULT_RUNGS = [r for r in rung_grid(10_000, 2_000_000) if r >= 340_000]
LAST_RESULTS: list[dict] = []
"""The rungs :func:`main` measured last (``bench.run`` judges the ladder's targets with them)."""


QUERIES: dict[str, Callable[[Any], int]] = {"wordcount": word_count, "two_action": two_action}


def lines_table(pool: LinePool, n: int) -> Any:
    """``n`` of the load generator's lines (``n`` a multiple of 1,000) as an Arrow table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunk = b"".join(bytes(pool.block(i)) for i in range(n // BLOCK_LINES)).rstrip(b"\n")
    lines = pc.split_pattern(pa.array([chunk], pa.binary()), b"\n").values.cast(pa.string())
    return pa.table({"value": lines})


def _timed(sampler: CpuSampler, query: Callable[[Any], int], df: Any, runs: int, n: int) -> dict:
    for _ in range(2):
        query(df)
    walls: list[float] = []
    start = time.monotonic()
    for _ in range(runs):
        t0 = time.perf_counter()
        got = query(df)
        walls.append((time.perf_counter() - t0) * 1000)
        if got != n:
            raise RuntimeError(f"the query counted {got} lines of {n}: the data is not all there")
    end = time.monotonic()
    time.sleep(0.5)  # a sample after the window, to read the window's end from
    busy = sampler.busy_cores(start, end)
    p50 = statistics.median(walls)
    return {
        "p50_ms": p50,
        "min_ms": min(walls),
        "max_ms": max(walls),
        "busy_cores": busy,
        "core_s": None if busy is None else busy * sum(walls) / 1000 / runs,
        "runs": len(walls),
    }


def measure_rung(spark: Any, sampler: CpuSampler, pool: LinePool, n: int, runs: int) -> dict:
    """Every query on every form for one batch of ``n`` lines."""
    base = spark.createDataFrame(lines_table(pool, n)).repartition(4)
    out: dict[str, Any] = {"lines": n}
    for form in FORMS:
        if form == "cache":
            df = base.cache()
            df.count()
        else:
            df = base.localCheckpoint(eager=True)
        try:
            for name, query in QUERIES.items():
                out[f"{name}/{form}"] = _timed(sampler, query, df, runs, n)
        finally:
            if form == "cache":
                df.unpersist(blocking=True)
            else:
                df.rdd.unpersist(blocking=True)
    return out


def best(rung: dict, query: str, cores: float = CORES_PER_INTERVAL) -> dict:
    """The figures of the form that counts for ``query``: the faster (by p50) of those that
    fit, else the faster of all (so a rung fits when either form does)."""
    forms = [rung[f"{query}/{f}"] for f in FORMS]
    return min([r for r in forms if fits(r, cores=cores)] or forms, key=lambda r: r["p50_ms"])


def fits(
    figures: dict, *, interval_ms: float = INTERVAL_MS, cores: float = CORES_PER_INTERVAL
) -> bool:
    """Whether Spark alone leaves room in the interval: p50 below it and the CPU below all
    the cores for it. (A batch also has to be received; this is only the query.)"""
    core_s = figures.get("core_s")
    return figures["p50_ms"] < interval_ms and (
        core_s is None or core_s < cores * interval_ms / 1000
    )


def lowest_failing(rungs: Sequence[dict]) -> dict[str, int]:
    """Per query (the ladder's pipeline name), the smallest batch Spark alone did not fit."""
    out = {}
    for q in QUERIES:
        failed = [r["lines"] for r in rungs if f"{q}/cache" in r and not fits(best(r, q))]
        if failed:
            out[q] = min(failed)
    return out


def _bounds(rungs: Sequence[dict], query: str, cores: float) -> str:
    held = [r["lines"] for r in rungs if fits(best(r, query, cores), cores=cores)]
    failed = [r["lines"] for r in rungs if not fits(best(r, query, cores), cores=cores)]
    hi = min(failed) if failed else None
    lo = max((x for x in held if hi is None or x < hi), default=None)
    if hi is None:
        return f"fits every rung measured, up to {lo:,} lines per 1 s batch"
    low = f"{lo:,} lines per 1 s batch" if lo else "none of the rungs below it"
    return f"fits up to {low}, not {hi:,}"


def _f(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def render(data: dict[str, Any]) -> str:
    """The ``query_floor`` section's body from a run's raw data (its rungs, the cores)."""
    rungs, cores = data["rungs"], float(data["cores"])
    rows = [
        "| lines per batch | query | cache p50 / min ms | checkpoint p50 / min ms "
        "| busy cores | CPU per batch (core-s) | fits a 1 s batch |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rungs:
        for q in QUERIES:
            c, k, b = r[f"{q}/cache"], r[f"{q}/checkpoint"], best(r, q, cores)
            rows.append(
                f"| {r['lines']:,} | {q} | {_f(c['p50_ms'])} / {_f(c['min_ms'])} "
                f"| {_f(k['p50_ms'])} / {_f(k['min_ms'])} | {_f(b['busy_cores'], '.2f')} "
                f"| {_f(b['core_s'], '.2f')} | {'yes' if fits(b, cores=cores) else 'no'} |"
            )
    summary = [f"- {q}: Spark alone {_bounds(rungs, q, cores)}." for q in QUERIES]
    return "\n\n".join(
        [
            "\n".join(rows),
            "\n".join(summary),
            "Busy cores and CPU are those of the form that counts (the faster of those that fit, "
            "else the faster); `fits` = p50 < 1,000 ms and CPU < "
            f"{cores:.0f} core-seconds.",
        ]
    )


SECTION = Section(
    name="query_floor",
    module="bench.query_floor",
    title="Spark alone: the batch query on rows in memory (issue 20)",
    render=render,
    about=doc_tail(__doc__),
)


def warm_up(spark: Any, pool: LinePool, seconds: float) -> None:
    """Word counts on a million cached lines for ``seconds``: the JIT's warm-up."""
    df = spark.createDataFrame(lines_table(pool, 1_000_000)).repartition(4).cache()
    df.count()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        word_count(df)
    df.unpersist(blocking=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.query_floor", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="3 rungs, 3 runs each")
    p.add_argument("--rungs", help="lines per batch, comma-separated (the ladder's from 346,000)")
    p.add_argument("--runs", type=int, help="timed runs per query, form and rung (7; quick 3)")
    p.add_argument("--warm-up", type=float, help="seconds of JIT warm-up (20; quick 5)")
    add_record_arguments(p)
    args = p.parse_args(argv)
    rungs = (
        [int(x) // BLOCK_LINES * BLOCK_LINES for x in args.rungs.split(",")]
        if args.rungs
        else (DEFAULT_RUNGS[::3] if args.quick else DEFAULT_RUNGS)
    )
    runs = args.runs or (3 if args.quick else 7)
    results = []
    with Recording(SECTION, "python -m bench.query_floor", argv, args) as rec:
        spark = local_session("query-floor")
        pool = LinePool()
        try:
            with CpuSampler() as sampler:
                warm_up_s = (
                    args.warm_up if args.warm_up is not None else (5.0 if args.quick else 20.0)
                )
                warm_up(spark, pool, warm_up_s)
                for n in rungs:
                    rung = measure_rung(spark, sampler, pool, n, runs)
                    print(json.dumps(rung), flush=True)
                    results.append(rung)
        finally:
            spark.stop()
    LAST_RESULTS[:] = results
    data = {"cores": CORES_PER_INTERVAL, "runs": runs, "rungs": results}
    print(render(data), flush=True)
    rec.finish(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
