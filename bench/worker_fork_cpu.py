"""What a freshly forked Python worker costs: PySpark's daemon against ours (decision 0020).

    python -m bench.worker_fork_cpu --rounds 2 --jobs 8

One local session per daemon module and round, alternating (``pyspark.daemon``, then
``spark_receivers.spark.worker_daemon``), with ``spark.python.worker.reuse=false``, so
every task is a new fork. Each job is two ``mapInArrow`` tasks that import what a batch
read imports (pyarrow, ``spark_receivers.spark.block_source``) and report their own
process's CPU (user + system since the fork, ``getrusage``). Prints the median and mean
per worker of each session, the first job's workers left out (the daemon's own start).
A tool for the decision, not a section of ``make bench``: CPU-seconds, not wall time, so a
busy machine changes it little (the decision says what ran beside it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Any

DAEMONS = ("pyspark.daemon", "spark_receivers.spark.worker_daemon")


def _probe(batches: Any) -> Any:
    import resource

    import pyarrow as pa

    from spark_receivers.spark import block_source  # noqa: F401 - what a batch read imports

    for _ in batches:
        pass
    usage = resource.getrusage(resource.RUSAGE_SELF)
    yield pa.RecordBatch.from_pylist([{"cpu": usage.ru_utime + usage.ru_stime}])


def session(daemon: str, jobs: int) -> list[float]:
    """CPU-seconds of each forked worker of ``jobs`` two-task jobs (the first job left out)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.python.daemon.module", daemon)
        .config("spark.python.worker.reuse", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    cpus: list[float] = []
    try:
        for job in range(jobs):
            rows = spark.range(0, 2, 1, 2).mapInArrow(_probe, "cpu double").collect()
            if job > 0:
                cpus += [float(r["cpu"]) for r in rows]
    finally:
        spark.stop()
    return cpus


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.worker_fork_cpu", description=__doc__)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--daemon", choices=DAEMONS, help=argparse.SUPPRESS)  # one session, here
    args = p.parse_args(argv)
    if args.daemon:
        cpus = session(args.daemon, args.jobs)
        print(" ".join(f"{c:.4f}" for c in cpus))
        return 0
    print("| round | daemon | workers | CPU s per worker, median | mean |")
    print("|---:|---|---:|---:|---:|")
    for round_ in range(1, args.rounds + 1):
        for daemon in DAEMONS:
            # A fresh process (and JVM) per session; JAVA_TOOL_OPTIONS could name a daemon.
            env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
            cmd = [sys.executable, "-m", "bench.worker_fork_cpu", "--daemon", daemon]
            cmd += ["--jobs", str(args.jobs)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if out.returncode != 0:
                print(f"| {round_} | {daemon} | failed: {out.stderr.strip()[-300:]} | | |")
                continue
            cpus = [float(x) for x in out.stdout.split()[-(2 * (args.jobs - 1)) :]]
            print(
                f"| {round_} | `{daemon}` | {len(cpus)} | {statistics.median(cpus):.2f} "
                f"| {statistics.mean(cpus):.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
