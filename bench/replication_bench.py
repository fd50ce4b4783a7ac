"""Issue 18: what the second copy of every block costs, replication 2 against 1, side by side.

    python -m bench.replication_bench                 # ~7 min, writes its BENCHMARKS.md section
    python -m bench.replication_bench --quick         # smoke: 3 s store runs, 25 s word counts
    python -m bench.replication_bench --quick --skip-word-count --no-write

Two measurements, each run for ``MEMORY_AND_DISK`` (one copy) and ``MEMORY_AND_DISK_2``
(two) in the order 1, 2, 2, 1, so a drift of the machine weighs on both alike:

1. **store(one)**, no Spark: a real :class:`ReceiverSupervisor` whose receiver calls
   ``store(record)`` (100-byte records) as fast as it can for ``--store-seconds``, against
   a driver stand-in (a real authenticated Flight endpoint) that names a second block
   keeper — a real keeper process standing for another executor — as the replica target.
   Reported: records/s accepted by the driver; per block, the time from handing it to
   the block handler until it is kept (``store``: the keeper put, plus the replica's in
   parallel) and the ``AddBlocks`` call that reports it (a call carries the blocks that
   waited while the previous one was in flight), p50/p99. The replica round trip is what
   ``store`` adds between the two levels.
2. **word count capacity** on ``local-cluster[2,2,1024]`` (two executors, so the replica
   really crosses to the other one): two ``GeneratorReceiver`` s (one per executor)
   offered without limit, backpressure on (PID), 1 s batches, the word count
   (``explode(split)`` → ``groupBy`` → ``collect``). Capacity is the records processed per
   second over the second half of ``--wc-seconds``: with backpressure the receivers are
   held to what the pipeline processes.

Ratios (2 ÷ 1) are given as a range: the lowest and highest over the pairings of the
runs (each one-copy run against each two-copy run). Target (issue 18): ≥ 0.85.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from bench.record import Recording, Section, add_record_arguments
from bench.step import REPO_ROOT

LEVELS = ("MEMORY_AND_DISK", "MEMORY_AND_DISK_2")
RECORD = "x" * 100


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- store(one), no Spark -----------------------------------------------------------------


def store_one(level: str, seconds: float) -> dict[str, Any]:
    """Run one store(one) measurement at ``level``; see the module doc."""
    from spark_receivers import Receiver, StreamingConfig
    from spark_receivers.receiver.block_keeper import KeeperSettings
    from spark_receivers.receiver.keeper_process import ensure_local_keeper
    from spark_receivers.receiver.supervisor import ReceiverSupervisor
    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.auth import new_secret
    from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint

    secret = new_secret()
    other_executor = subprocess.Popen(["sleep", str(int(seconds) + 120)])
    settings = KeeperSettings(secret, "127.0.0.1", 0, memory_budget_bytes=4 << 30)
    other = ensure_local_keeper(settings, watch_pid=other_executor.pid)
    add_ms: list[float] = []
    accepted = [0]

    def handle(message: Any) -> Any:
        if isinstance(message, m.GetReplicaTargets):
            return [other.address]
        if isinstance(message, m.AddBlocks):
            accepted[0] += sum(info.num_records for info in message.block_infos)
            return [True] * len(message.block_infos)
        if isinstance(message, m.AddBlock):
            accepted[0] += message.block_info.num_records
        return None if isinstance(message, m.ReportReplication | m.ReportError) else True

    driver = FlightEndpoint("driver", "127.0.0.1", secret, m.TRACKER_MESSAGES, handle)

    class Flood(Receiver):
        def on_start(self) -> None:
            threading.Thread(target=self._run, daemon=True).start()

        def on_stop(self) -> None:
            pass

        def _run(self) -> None:
            while not self.is_stopped():
                try:
                    self.store(RECORD)
                except Exception:
                    return

    receiver = Flood(storage_level=level)
    cfg = StreamingConfig(block_interval_ms=200, receiver_drain_timeout_s=1.0)
    sup = ReceiverSupervisor(receiver, 0, driver.address, secret, cfg, "127.0.0.1", "exec-a")
    store_ms: list[float] = []
    handler_store = sup.block_handler.store_block
    tracker_call = sup.pipe._reporter._call  # bench only: time the two steps of a push

    def timed_store(*args: Any) -> Any:
        t = time.perf_counter()
        try:
            return handler_store(*args)
        finally:
            store_ms.append((time.perf_counter() - t) * 1000)

    def timed_call(message: Any, timeout_s: float | None = None) -> Any:
        t = time.perf_counter()
        try:
            return tracker_call(message, timeout_s)
        finally:
            if isinstance(message, m.AddBlock | m.AddBlocks):
                add_ms.append((time.perf_counter() - t) * 1000)

    sup.block_handler.store_block = timed_store  # type: ignore[method-assign]
    sup.pipe._reporter._call = timed_call
    try:
        sup.start()
        time.sleep(1.0)  # the first blocks (keeper connections, first replica) left out
        start_records, store_ms[:], add_ms[:] = accepted[0], [], []
        started = time.perf_counter()
        time.sleep(seconds)
        elapsed = time.perf_counter() - started
        records = accepted[0] - start_records
        copies = sup.pipe._sink.copies if hasattr(sup.pipe._sink, "copies") else None
    finally:
        sup.stop("bench over")
        sup.await_termination(30)
        for address in {other.address, *(k for k in [_local_keeper(sup)] if k)}:
            client = EndpointClient(address, secret, timeout_s=5)
            with contextlib.suppress(Exception):
                client.call(m.ReleaseKeeper())
            client.close()
        driver.close()
        other_executor.kill()
        other_executor.wait()
    return {
        "level": level,
        "records_per_s": records / elapsed,
        "copies": copies,
        "blocks": len(store_ms),
        "store_p50_ms": _pct(store_ms, 0.5),
        "store_p99_ms": _pct(store_ms, 0.99),
        "add_block_p50_ms": _pct(add_ms, 0.5),
        "add_block_p99_ms": _pct(add_ms, 0.99),
    }


def _local_keeper(sup: Any) -> str | None:
    keeper = getattr(sup.pipe._sink, "_keeper", None)
    return keeper.address if keeper is not None else None


# --- word count capacity on local-cluster ---------------------------------------------------


def word_count(level: str, seconds: float) -> dict[str, Any]:
    """Run the word count at ``level`` in a child process (its own JVM); see the module doc."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.replication_bench",
            "--child",
            level,
            "--wc-seconds",
            str(seconds),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 300,
        cwd=REPO_ROOT,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable},
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("WC ")]
    if proc.returncode != 0 or not lines:
        return {"level": level, "error": (proc.stderr or proc.stdout)[-2000:]}
    return json.loads(lines[-1][3:])


def _word_count_child(level: str, seconds: float) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_receivers import GeneratorReceiver, StreamingConfig, StreamingContext

    spark = (
        SparkSession.builder.master("local-cluster[2,2,1024]")
        .appName(f"bench-replication-{level}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executor.memory", "512m")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    cfg = StreamingConfig(
        backpressure_enabled=True,
        backpressure_initial_rate=20_000,
        receiver_drain_timeout_s=5.0,
    )
    ssc = StreamingContext(spark, batch_interval_ms=1000, config=cfg)
    done: list[tuple[float, int]] = []
    lock = threading.Lock()

    def count(df: Any, batch_time_ms: int) -> None:
        words = df.select(F.explode(F.split("value", " ")).alias("w"))
        rows = words.groupBy("w").count().collect()
        with lock:
            done.append((time.monotonic(), df.count() if rows else 0))

    for _ in range(2):
        receiver = GeneratorReceiver(rate=None)
        receiver.storage_level = level
        ssc.receiver_stream(receiver).foreach_batch(count)
    ssc.start()
    started = time.monotonic()
    time.sleep(seconds)
    with lock:
        late = [(t, n) for t, n in done if t >= started + seconds / 2]
    status = ssc.status()
    ssc.stop(graceful=False)
    spark.stop()
    span = (late[-1][0] - late[0][0]) if len(late) > 1 else 0.0
    rate = sum(n for _, n in late[1:]) / span if span > 0 else 0.0
    print(
        "WC "
        + json.dumps(
            {
                "level": level,
                "records_per_s": rate,
                "batches": len(late),
                "copies": {str(k): list(v) for k, v in status.block_copies.items()},
                "failure": status.failure,
            }
        ),
        flush=True,
    )


# --- report ------------------------------------------------------------------------------------


def ratio_range(results: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    """Lowest and highest ``two ÷ one`` of ``key`` over every pairing of the runs."""
    one = [r[key] for r in results if r["level"] == LEVELS[0] and r.get(key)]
    two = [r[key] for r in results if r["level"] == LEVELS[1] and r.get(key)]
    ratios = [b / a for a in one for b in two if a > 0]
    return (min(ratios), max(ratios)) if ratios else None


def render(data: dict[str, Any]) -> str:
    """The ``replication`` section's body from a run's raw data."""
    store: list[dict[str, Any]] = data["store"]
    wc: list[dict[str, Any]] = data["wc"]

    def fmt(x: Any, spec: str = ",.0f") -> str:
        return format(x, spec) if isinstance(x, int | float) and x == x else "-"

    def verdict(r: tuple[float, float] | None) -> str:
        if r is None:
            return "not measured"
        lo, hi = r
        met = "met" if lo >= 0.85 else ("not met" if hi < 0.85 else "not met in every pairing")
        return f"[{lo:.2f}, {hi:.2f}] ({met}: target ≥ 0.85)"

    out = [
        "store(one), no Spark: a real supervisor, a real keeper process per 'executor', "
        "100-byte records as fast as the receiver's thread stores them; 200 ms blocks.",
        "",
        "| run | level | copies | records/s | blocks | store p50 / p99 ms "
        "| AddBlocks call p50 / p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(store, 1):
        out.append(
            f"| {i} | {r['level']} | {r.get('copies')} | {fmt(r['records_per_s'])} | "
            f"{r['blocks']} | {fmt(r['store_p50_ms'], '.1f')} / {fmt(r['store_p99_ms'], '.1f')} "
            f"| {fmt(r['add_block_p50_ms'], '.1f')} / {fmt(r['add_block_p99_ms'], '.1f')} |"
        )
    lat = {lvl: [r for r in store if r["level"] == lvl] for lvl in LEVELS}
    added50 = (
        statistics.mean(r["store_p50_ms"] for r in lat[LEVELS[1]])
        - statistics.mean(r["store_p50_ms"] for r in lat[LEVELS[0]])
        if lat[LEVELS[0]] and lat[LEVELS[1]]
        else float("nan")
    )
    added99 = (
        statistics.mean(r["store_p99_ms"] for r in lat[LEVELS[1]])
        - statistics.mean(r["store_p99_ms"] for r in lat[LEVELS[0]])
        if lat[LEVELS[0]] and lat[LEVELS[1]]
        else float("nan")
    )
    out += [
        "",
        "- store(one) records/s, two copies ÷ one: "
        f"{verdict(ratio_range(store, 'records_per_s'))}.",
        f"- Latency the replica round trip adds before AddBlock (mean of the runs' store "
        f"p50 / p99, two copies minus one): {fmt(added50, '.1f')} / {fmt(added99, '.1f')} ms.",
    ]
    if not wc:
        out += ["", "Word count on `local-cluster[2,2,1024]`: not run (`--skip-word-count`)."]
        return "\n".join(out) + "\n"
    out += [
        "",
        "Word count on `local-cluster[2,2,1024]`, two generator receivers (one per executor), "
        "backpressure on, 1 s batches; capacity = records processed per second over the second "
        "half of the run.",
        "",
        "| run | level | copies (stream: kept, wanted) | processed records/s | batches | failure |",
        "|---|---|---|---:|---:|---|",
    ]
    for i, r in enumerate(wc, 1):
        if "error" in r:
            out.append(f"| {i} | {r['level']} | - | - | - | error: {r['error'][-200:]!r} |")
            continue
        out.append(
            f"| {i} | {r['level']} | {r['copies']} | {fmt(r['records_per_s'])} | "
            f"{r['batches']} | {r['failure'] or ''} |"
        )
    ok = [r for r in wc if "error" not in r]
    out += [
        "",
        f"- Word-count capacity, two copies ÷ one: {verdict(ratio_range(ok, 'records_per_s'))}.",
    ]
    return "\n".join(out) + "\n"


SECTION = Section(
    name="replication",
    module="bench.replication_bench",
    title="Replicated blocks: two copies against one (issue 18)",
    render=render,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.replication_bench", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="short runs (smoke)")
    p.add_argument("--store-seconds", type=float, help="per store run (10; quick 3)")
    p.add_argument("--wc-seconds", type=float, help="per word-count run (60; quick 25)")
    p.add_argument("--skip-word-count", action="store_true")
    add_record_arguments(p)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    store_s = args.store_seconds or (3.0 if args.quick else 10.0)
    wc_s = args.wc_seconds or (25.0 if args.quick else 60.0)
    if args.child:
        _word_count_child(args.child, wc_s)
        return 0
    order = [LEVELS[0], LEVELS[1], LEVELS[1], LEVELS[0]]
    store: list[dict[str, Any]] = []
    wc: list[dict[str, Any]] = []
    with Recording(SECTION, "python -m bench.replication_bench", argv, args) as rec:
        for level in order:
            store.append(store_one(level, store_s))
            print(json.dumps(store[-1]), flush=True)
        if not args.skip_word_count:
            for level in order:
                wc.append(word_count(level, wc_s))
                print(json.dumps(wc[-1]), flush=True)
    data = {"store_seconds": store_s, "wc_seconds": wc_s, "store": store, "wc": wc}
    print(render(data))
    rec.finish(data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
