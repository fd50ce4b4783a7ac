"""How a receiver starts: from ``ssc.start()`` to its registration and its first records.

    python -m bench.receiver_start --runs 3
    python -m bench.receiver_start --runs 3 --no-warm-up     # as the tests' contexts start

Each run is a fresh process and JVM (``local[2]``, UI off) with one generator receiver at
100 records/s and a ``count()`` per 1 s batch. It prints when the session was up, when
``start()`` returned, when the receiver registered (the listener's ``on_receiver_started``)
and when the first batch with records completed, all in seconds from the process's start;
then every Python process of the run (the executor's daemons, the workers they fork, the
block keeper) with its start and its CPU-seconds, sampled from ``/proc`` every 0.1 s (a
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

TAG = "SPARK_RECEIVERS_START_TAG"
"""Marks every process of one run (the JVM and the Python processes inherit it)."""


def _cmdline(pid: str) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [x.decode(errors="replace") for x in f.read().split(b"\0") if x]


def _kind(cmd: list[str], parent: list[str]) -> str | None:
    line = " ".join(cmd)
    if not cmd or "java" in os.path.basename(cmd[0]):
        return None
    if "block_keeper" in line:  # the spawner runs -c code that forks and execs the keeper
        return "keeper spawner" if "-c" in cmd else "keeper"
    if "daemon" in line:  # spark_receivers.spark.worker_daemon or pyspark.daemon
        forked = parent and "java" not in os.path.basename(parent[0])
        return "worker (forked)" if forked else "daemon"
    return None


class ProcessWatch:
    """Every Python process carrying this run's tag: its kind, start and CPU-seconds."""

    def __init__(self, tag: str, t0: float) -> None:
        self.tag = f"{TAG}={tag}".encode()
        self.t0 = t0
        self.hz = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            self.boot = float(f.read().split("btime ")[1].split()[0])
        self.seen: dict[str, dict[str, Any]] = {}
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
        while not self._stop.wait(0.1):
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    self._sample(pid)

    def _sample(self, pid: str) -> None:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if self.tag not in f.read():
                    return
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            kind = _kind(_cmdline(pid), _cmdline(fields[1]))
        except OSError:
            return
        if kind is None:
            return
        self.seen[pid] = {
            "pid": int(pid),
            "kind": kind,
            "start_s": round(self.boot + int(fields[19]) / self.hz - self.t0, 2),
            "cpu_s": round((int(fields[11]) + int(fields[12])) / self.hz, 2),
        }


def child(warm_up: bool) -> dict[str, Any]:
    """One run, in this process: the timeline as a dict (seconds from this process's start)."""
    t0 = time.time()
    os.environ[TAG] = str(os.getpid())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    watch = ProcessWatch(str(os.getpid()), t0).start()
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
