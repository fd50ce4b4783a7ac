"""How a receiver starts: from ``ssc.start()`` to its registration and its first records.

    python -m bench.receiver_start --runs 3
    python -m bench.receiver_start --runs 3 --no-warm-up     # as the tests' contexts start

Each run is a fresh process and JVM (``local[2]``, UI off) with one generator receiver at
100 records/s and a ``count()`` per 1 s batch. It prints when the session was up, when
``start()`` returned, when the receiver registered (the listener's ``on_receiver_started``)
and when the first batch with records completed, all in seconds from the process's start;
then every Python process of the run (the executor's daemons, the workers they fork, the
data source's planning workers, the block keeper) with when it was first seen and its
CPU-seconds, sampled from ``/proc`` every 0.1 s by ``bench/proc_cpu.py``'s helpers (a
process that lives less than that may be missed). A tool for finding where a start's time
goes, not a section of ``make bench``; a busy machine stretches every step (the CPU-seconds
change less), so say what ran beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from bench import proc_cpu
from bench.harness import stat_cpu_seconds

SHOWN = (proc_cpu.DAEMONS, proc_cpu.TASK_WORKERS, proc_cpu.PLANNER, proc_cpu.KEEPER)
"""The kinds of :func:`bench.proc_cpu.classify` a run lists (not this process, the JVM)."""


class ProcessWatch:
    """The Python processes under this one, and its block keepers: kind, first seen, CPU.

    Every 0.1 s, :func:`bench.proc_cpu.descendants` of this process (the JVM, its daemons
    and the workers they fork) and the keepers of its JVMs (:func:`bench.proc_cpu.keepers_of`:
    they run detached), classified by :func:`bench.proc_cpu.classify`.
    """

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.seen: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-watch", daemon=True)

    def start(self) -> ProcessWatch:
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(5)
        return sorted(self.seen.values(), key=lambda p: p["start_s"])

    def _run(self) -> None:
        root = os.getpid()
        while not self._stop.wait(0.1):
            procs = proc_cpu.descendants(root)
            jvms = [p.pid for p in procs.values() if p.comm == "java"]
            for keeper in proc_cpu.keepers_of(jvms):
                procs.update(proc_cpu.descendants(keeper))
            for info in procs.values():
                kind = proc_cpu.classify(info, root, procs)
                if kind in SHOWN:
                    self._sample(info.pid, kind)

    def _sample(self, pid: int, kind: str) -> None:
        try:
            cpu = stat_cpu_seconds(f"/proc/{pid}/stat")
        except (OSError, IndexError, ValueError):
            return  # it ended
        first = self.seen.get(pid, {}).get("start_s", round(time.time() - self.t0, 2))
        self.seen[pid] = {"pid": pid, "kind": kind, "start_s": first, "cpu_s": round(cpu, 2)}


def child(warm_up: bool) -> dict[str, Any]:
    """One run, in this process: the timeline as a dict (seconds from this process's start)."""
    t0 = time.time()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    watch = ProcessWatch(t0).start()
    from pyspark.sql import SparkSession

    from spark_receivers import StreamingContext
    from spark_receivers.driver.observe.listener import StreamingListener
    from spark_receivers.receivers.generator import GeneratorReceiver

    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    if not warm_up:
        builder = builder.config("spark.receivers.warmUp.timeout", "0")
    spark = builder.getOrCreate()
    out: dict[str, Any] = {"spark_up_s": round(time.time() - t0, 2)}

    class Times(StreamingListener):
        def on_receiver_started(self, info: Any) -> None:
            out.setdefault("registered_s", round(time.time() - t0, 2))

        def on_batch_completed(self, info: Any) -> None:
            if info.num_records:
                out.setdefault("first_records_s", round(time.time() - t0, 2))

    ssc = StreamingContext(spark, 1000)
    ssc.add_streaming_listener(Times())
    ssc.receiver_stream(GeneratorReceiver(rate=100)).foreach_batch(lambda df, t: df.count())
    out["start_called_s"] = round(time.time() - t0, 2)
    ssc.start()
    out["start_returned_s"] = round(time.time() - t0, 2)
    deadline = time.monotonic() + 120
    while "first_records_s" not in out and time.monotonic() < deadline:
        time.sleep(0.1)
    out["processes"] = watch.stop()
    ssc.stop(graceful=False)
    spark.stop()
    return out


def _row(i: int, r: dict[str, Any]) -> str:
    def at(key: str) -> str:
        value = r.get(key)
        return "-" if value is None else f"{value - r['start_returned_s']:.1f}"

    kinds: dict[str, list[float]] = {}
    for p in r["processes"]:
        kinds.setdefault(p["kind"], []).append(p["cpu_s"])
    procs = "; ".join(
        f"{len(v)} {k} ({', '.join(f'{c:.2f}' for c in v)} CPU-s)" for k, v in sorted(kinds.items())
    )
    return (
        f"| {i} | {r['spark_up_s']:.1f} | {at('registered_s')} | {at('first_records_s')} "
        f"| {procs} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.receiver_start", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="spark.receivers.warmUp.timeout=0, as the tests' contexts start",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(warm_up=not args.no_warm_up)), flush=True)
        return 0
    if args.runs < 1:
        p.error(f"--runs must be >= 1, got {args.runs}")
    cmd = [sys.executable, "-m", "bench.receiver_start", "--child"]
    cmd += ["--no-warm-up"] if args.no_warm_up else []
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    print(
        "| run | session up (s) | registered (s after start()) | first records (s after "
        "start()) | Python processes |\n|---:|---:|---:|---:|---|"
    )
    for i in range(1, args.runs + 1):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if done.returncode != 0 or not lines:
            print(f"run {i} failed ({done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        print(_row(i, json.loads(lines[-1])), flush=True)
    print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
