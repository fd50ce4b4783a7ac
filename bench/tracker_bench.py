"""The driver's tracker endpoint under 1,000 simulated supervisors, measured through it.

    python -m bench.tracker_bench          # 1,000 x 5 and x 6 blocks/s for 20 s, 3 runs each
    python -m bench.tracker_bench --quick  # smoke: 100 x 5 blocks/s for 3 s, 1 run
    python -m bench.tracker_bench --supervisors 200 --seconds 5 --no-write

What runs, **through the real endpoint**: a **driver process** with the tracker's endpoint as
the driver runs it, without Spark: a :class:`~spark_receivers.rpc.transport.FlightEndpoint`
(Arrow Flight, every call authenticated, messages decoded against ``TRACKER_MESSAGES``) in
front of the real :class:`~spark_receivers.driver.tracking.receiver_tracker.ReceiverTracker` core
(registration, block validation and bookkeeping) and a real
:class:`~spark_receivers.driver.batches.received_block_tracker.ReceivedBlockTracker`, with a
stand-in launcher that runs no jobs; a batch thread allocates the blocks to a batch every
second and forgets old batches, as the JobGenerator does. **Client processes** each simulate
a share of the supervisors: every supervisor has its own ``EndpointClient`` (its own gRPC
channel, as in real executors) and its own
:class:`~spark_receivers.receiver.block_reporter.BlockReporter` (the supervisor's own class:
one call in flight, the blocks that piled up meanwhile sent together as ``AddBlocks``),
registers, then cuts blocks open loop at its rate with a random phase.

Reported: blocks accepted by the driver per second in the steady part of the window, its
last three quarters, counted by the driver itself (what "AddBlock/s" means here: one block
reported and accepted; the target is met when that rate is at least 5,000/s **and** at least
97 % of the offered rate, i.e. the driver kept up; it can exceed the offered rate while the
clients catch up on sends that fell late in the first quarter, and it can never exceed what
the driver did accept); the blocks answered within the window per
second as the clients saw them (lower by the blocks still in flight at its end), the
``AddBlocks`` calls per second that carried them,
latency (block cut to the driver's answer) p50/p99/max, how late blocks were cut against their
schedule (``lag``: a supervisor whose 20 unanswered blocks block its pusher falls behind), and
the driver process's CPU (user+system seconds from ``/proc/<pid>/stat`` over the window ÷ the
window). Clients and driver share the machine's cores; the clients' CPU is reported too.

Every rate runs ``--repeats`` times (3 by default; fresh driver and client processes each,
the rates taking turns so that a drift of the shared machine's load hits them alike). A rate
meets the target only when every run of it met it; the median and the spread of the runs
are given. It is offered at the target and above it: at exactly the target's offer one run
falls either side of 5,000 by noise (4,972 and 5,297 blocks/s in two runs of 2026-11-24,
15:42 and 15:46 UTC).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

from bench.harness import stat_cpu_seconds
from bench.record import Recording, Section, add_record_arguments, doc_tail
from bench.repeats import DEFAULT_REPEATS, Outcome, Spread, verdict

__all__ = [
    "SECTION",
    "TrackerResult",
    "cpu_seconds",
    "percentile",
    "render",
    "schedule",
    "summarize",
]

RECORDS_PER_BLOCK = 4000  # 20,000 records/s per receiver at a 200 ms block interval
TARGET_PER_S = 5_000  # issue 20: 1,000 supervisors x 5 blocks/s (200 ms blocks)
KEEP_UP = 0.97  # accepted / offered in the steady window: below it the driver fell behind
STEADY_FROM = 0.25  # the steady window starts this far into the send window


# -- pure helpers ------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (as the throughput harness); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return float(ordered[int(rank) - 1])


def schedule(
    n_supervisors: int, rate_per_s: float, seconds: float, seed: int = 0
) -> list[tuple[float, int]]:
    """Every send of ``n_supervisors`` at ``rate_per_s`` each over ``seconds``, by due time.

    Each supervisor starts at a random phase within its period, then sends every period:
    ``(offset_s, supervisor_index)`` sorted by offset, all offsets in ``[0, seconds)``.
    """
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    period = 1.0 / rate_per_s
    rng = random.Random(seed)
    sends = []
    for i in range(n_supervisors):
        t = rng.uniform(0, period)
        while t < seconds:
            sends.append((t, i))
            t += period
    sends.sort()
    return sends


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from ``/proc/<pid>/stat`` (Linux)."""
    return stat_cpu_seconds(f"/proc/{pid}/stat")


@dataclass(frozen=True)
class TrackerResult:
    """One run's numbers."""

    supervisors: int
    rate_per_supervisor: float
    clients: int
    seconds: float
    offered: int
    completed: int
    failed: int
    accepted_by_driver: int
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    latency_max_ms: float | None
    lag_p99_ms: float | None
    driver_cpu_pct: float
    clients_cpu_pct: float
    first_error: str | None = None
    calls: int = 0
    """``AddBlocks`` calls made within the window."""
    steady_accepted_rate: float = 0.0
    """Blocks/s the driver accepted over the window's last three quarters (its own count)."""

    @property
    def offered_rate(self) -> float:
        return self.supervisors * self.rate_per_supervisor

    @property
    def completed_rate(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    def meets(self, target_per_s: float = TARGET_PER_S) -> bool:
        """At least ``target_per_s`` accepted in the steady window, keeping up with the offer."""
        rate = self.steady_accepted_rate
        return rate >= target_per_s and rate >= KEEP_UP * self.offered_rate

    @property
    def calls_rate(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0


def summarize(
    *,
    supervisors: int,
    rate: float,
    clients: int,
    seconds: float,
    reports: Sequence[dict[str, Any]],
    accepted: int,
    driver_cpu_s: float,
    steady_accepted_rate: float = 0.0,
) -> TrackerResult:
    """Merge the client processes' reports into one :class:`TrackerResult`."""
    latencies = [x for r in reports for x in r["latencies_ms"]]
    lags = [x for r in reports for x in r["lags_ms"]]
    errors = [r["first_error"] for r in reports if r.get("first_error")]
    return TrackerResult(
        supervisors=supervisors,
        rate_per_supervisor=rate,
        clients=clients,
        seconds=seconds,
        offered=sum(r["offered"] for r in reports),
        completed=len(latencies),
        failed=sum(r["failed"] for r in reports),
        accepted_by_driver=accepted,
        latency_p50_ms=percentile(latencies, 50),
        latency_p99_ms=percentile(latencies, 99),
        latency_max_ms=max(latencies) if latencies else None,
        lag_p99_ms=percentile(lags, 99),
        driver_cpu_pct=100.0 * driver_cpu_s / seconds if seconds > 0 else 0.0,
        clients_cpu_pct=100.0 * sum(r["cpu_s"] for r in reports) / seconds if seconds else 0.0,
        first_error=errors[0] if errors else None,
        calls=sum(int(r.get("calls", 0)) for r in reports),
        steady_accepted_rate=steady_accepted_rate,
    )


# -- the driver process --------------------------------------------------------------------------


def _driver_main(secret: str, n_streams: int, conn: Connection) -> None:
    from spark_receivers.driver.batches.received_block_tracker import ReceivedBlockTracker
    from spark_receivers.driver.observe.listener import ListenerBus
    from spark_receivers.driver.tracking.receiver_outbox import ReceiverOutbox
    from spark_receivers.driver.tracking.receiver_tracker import ReceiverTracker
    from spark_receivers.driver.tracking.scheduling_policy import ExecutorCacheTaskLocation
    from spark_receivers.receiver.receiver import Receiver
    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint

    class BenchReceiver(Receiver):
        def on_start(self) -> None:
            pass

        def on_stop(self) -> None:
            pass

    class BenchExecutors:
        """The launcher: one executor, where the client processes register from; no jobs."""

        executor = ExecutorCacheTaskLocation("127.0.0.1", "bench")

        def alive_executors(self) -> list[ExecutorCacheTaskLocation]:
            return [self.executor]

        def launch(self, stream_id: int, jobs: Any) -> None:
            jobs.job_starting(stream_id)

    receivers = []
    for sid in range(n_streams):
        r = BenchReceiver()
        r._stream_id = sid
        receivers.append(r)
    blocks = ReceivedBlockTracker(range(n_streams))
    bus = ListenerBus()
    bus.start()
    outbox = ReceiverOutbox(lambda address: EndpointClient(address, secret))
    # The real tracker core (validation, bookkeeping, registration), as the driver runs it.
    tracker = ReceiverTracker(
        receivers,
        blocks,
        bus,
        BenchExecutors(),
        outbox,  # type: ignore[arg-type]
    )
    tracker.start()
    stop = threading.Event()

    def batches() -> None:
        t = 0
        while not stop.wait(1.0):
            t += 1000
            blocks.allocate_blocks_to_batch(t)
            blocks.cleanup_old_batches(t - 2000)

    server = FlightEndpoint(
        "receiver-tracker", "127.0.0.1", secret, m.TRACKER_MESSAGES, tracker.handle
    )
    threading.Thread(target=batches, daemon=True).start()
    conn.send(server.address)
    while True:
        cmd = conn.recv()
        if cmd == "stats":
            conn.send(sum(r.blocks for r in tracker.receiver_statuses()))
        else:
            stop.set()
            server.close()
            outbox.close()
            bus.stop()
            conn.send("bye")
            return


# -- a client process --------------------------------------------------------------------------


def _client_main(
    secret: str,
    address: str,
    streams: list[int],
    rate: float,
    seconds: float,
    seed: int,
    conn: Connection,
) -> None:
    from concurrent.futures import Future

    from spark_receivers.receiver.block_reporter import BlockReporter
    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.transport import EndpointClient

    clients = [EndpointClient(address, secret, timeout_s=30) for _ in streams]
    for c, sid in zip(clients, streams, strict=True):
        endpoint = f"127.0.0.1:{10_000 + sid}"  # never called: the bench sends no commands
        ok = c.call(m.RegisterReceiver(sid, "BenchReceiver", "127.0.0.1", "bench", endpoint))
        if ok is not True:
            raise RuntimeError(f"registration of {sid} refused")
    # Each supervisor's pusher hands its blocks to its own BlockReporter (the supervisor's
    # real class, max_pending as with the default block queue), which sends them as AddBlocks.
    reporters = [
        BlockReporter(c.call, max_pending=20, name=f"reporter-{sid}")
        for c, sid in zip(clients, streams, strict=True)
    ]
    session = int(time.time() * 1000)
    seqs = [0] * len(streams)
    sends = schedule(len(streams), rate, seconds, seed)
    latencies: list[float] = []
    lags: list[float] = []
    failed = [0]
    first_error: list[str] = []
    lock = threading.Lock()
    conn.send("ready")
    t0 = conn.recv()  # the common start time (monotonic, one clock per host)
    cpu0 = cpu_seconds(os.getpid())
    window_end = t0 + seconds
    calls0 = sum(r.calls for r in reporters)

    def done(start: float, future: Future[bool]) -> None:
        end = time.monotonic()
        with lock:
            if future.exception() is None and future.result() is True:
                if end <= window_end:
                    latencies.append((end - start) * 1000)
            else:
                failed[0] += 1
                error = future.exception()
                if error is not None and not first_error:
                    first_error.append(f"{type(error).__name__}: {error}"[:300])

    # One thread plays every supervisor's pusher: at each block's due time it submits the
    # block (submit blocks only when that supervisor has max_pending blocks unanswered).
    for offset, i in sends:
        due = t0 + offset
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if time.monotonic() >= window_end:
            break  # sends not made by the end of the window: the clients fell behind
        sid = streams[i]
        info = m.ReceivedBlockInfo(
            stream_id=sid,
            block_id=f"input-{sid}-{session}-{seqs[i]}",
            num_records=RECORDS_PER_BLOCK,
            generated_ms=int(time.time() * 1000),
            store_endpoint="127.0.0.1:1",
            size_bytes=RECORDS_PER_BLOCK * 112,
        )
        seqs[i] += 1
        start = time.monotonic()
        lags.append((start - due) * 1000)
        reporters[i].submit(info).add_done_callback(lambda f, s=start: done(s, f))
    time.sleep(max(0.0, window_end - time.monotonic()))
    calls = sum(r.calls for r in reporters) - calls0
    cpu = cpu_seconds(os.getpid()) - cpu0
    for r in reporters:
        r.close(30)
    for c in clients:
        c.close()
    with lock:
        conn.send(
            {
                "offered": len(sends),
                "latencies_ms": list(latencies),
                "lags_ms": lags,
                "failed": failed[0],
                "first_error": first_error[0] if first_error else None,
                "cpu_s": cpu,
                "calls": calls,
            }
        )


def run(supervisors: int, rate: float, seconds: float, clients: int) -> TrackerResult:
    """One run: a driver process, ``clients`` client processes; blocks for the run."""
    from spark_receivers.rpc.auth import new_secret

    ctx = mp.get_context("spawn")
    secret = new_secret()
    d_conn, d_child = ctx.Pipe()
    driver = ctx.Process(target=_driver_main, args=(secret, supervisors, d_child), daemon=True)
    driver.start()
    if not d_conn.poll(60):
        raise RuntimeError("driver process did not start within 60 s")
    address = d_conn.recv()
    print(f"driver process {driver.pid} at {address}", file=sys.stderr, flush=True)  # py-spy
    shares = [list(range(supervisors))[k::clients] for k in range(clients)]
    procs, conns = [], []
    for k, share in enumerate(shares):
        c_conn, c_child = ctx.Pipe()
        p = ctx.Process(
            target=_client_main,
            args=(secret, address, share, rate, seconds, k, c_child),
            daemon=True,
        )
        p.start()
        procs.append(p)
        conns.append(c_conn)
    try:
        for c in conns:
            if not c.poll(120) or c.recv() != "ready":
                raise RuntimeError("a client process did not get ready within 120 s")
        d_conn.send("stats")
        accepted0 = d_conn.recv()
        t0 = time.monotonic() + 0.5
        cpu0 = cpu_seconds(driver.pid)  # type: ignore[arg-type]
        for c in conns:
            c.send(t0)

        def accepted_at(t: float) -> tuple[float, int]:
            time.sleep(max(0.0, t - time.monotonic()))
            d_conn.send("stats")
            count = d_conn.recv()
            return time.monotonic(), count

        steady0 = accepted_at(t0 + STEADY_FROM * seconds)
        # The driver's CPU over the send window only (clients' tail calls are a few ms).
        steady1 = accepted_at(t0 + seconds)
        driver_cpu = cpu_seconds(driver.pid) - cpu0  # type: ignore[arg-type]
        steady_rate = (steady1[1] - steady0[1]) / max(1e-9, steady1[0] - steady0[0])
        reports = []
        for c in conns:
            if not c.poll(seconds + 120):
                raise RuntimeError("a client process did not report within its window + 120 s")
            reports.append(c.recv())
        d_conn.send("stats")
        accepted = d_conn.recv() - accepted0
    finally:
        d_conn.send("stop")
        d_conn.poll(10)
        for p in [*procs, driver]:
            p.join(10)
            if p.is_alive():
                p.kill()
    return summarize(
        supervisors=supervisors,
        rate=rate,
        clients=clients,
        seconds=seconds,
        reports=reports,
        accepted=accepted,
        driver_cpu_s=driver_cpu,
        steady_accepted_rate=steady_rate,
    )


# -- report ------------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _result(d: dict[str, Any]) -> TrackerResult:
    return TrackerResult(**{k: d[k] for k in TrackerResult.__dataclass_fields__ if k in d})


def render(data: dict[str, Any]) -> str:
    """The ``tracker`` section's body: every run, then per rate the median, spread, verdict."""
    target = float(data["target_per_s"])
    runs = [(int(d["repeat"]), _result(d)) for d in data["runs"]]
    rows = [
        "| run | supervisors x blocks/s | offered/s | accepted by the driver, steady "
        f"(AddBlock/s) | ≥ {target:,.0f}/s and ≥ {KEEP_UP:.0%} of offered "
        "| answered in the window/s | AddBlocks calls/s | blocks per call | failed "
        "| latency p50 / p99 / max ms | send lag p99 ms | driver CPU | clients CPU |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in runs:
        per_call = r.completed / r.calls if r.calls else 0.0
        met = "yes" if r.meets(target) else "**no**"
        rows.append(
            f"| {i} | {r.supervisors:,} x {r.rate_per_supervisor:g} | {r.offered_rate:,.0f} "
            f"| {r.steady_accepted_rate:,.0f} | {met} | {r.completed_rate:,.0f} "
            f"| {r.calls_rate:,.0f} | {per_call:.1f} | {r.failed:,} "
            f"| {_ms(r.latency_p50_ms)} / {_ms(r.latency_p99_ms)} / {_ms(r.latency_max_ms)} "
            f"| {_ms(r.lag_p99_ms)} | {r.driver_cpu_pct:.0f} % | {r.clients_cpu_pct:.0f} % |"
        )
    summary = [
        "| supervisors x blocks/s | accepted by the driver, steady (AddBlock/s) "
        f"| target: ≥ {target:,.0f}/s and ≥ {KEEP_UP:.0%} of offered, in every run |",
        "|---|---:|---|",
    ]
    for rate in dict.fromkeys(r.rate_per_supervisor for _, r in runs):
        group = [r for _, r in runs if r.rate_per_supervisor == rate]
        accepted = Spread(tuple(r.steady_accepted_rate for r in group))
        outcomes = [Outcome.MET if r.meets(target) else Outcome.MISSED for r in group]
        summary.append(
            f"| {group[0].supervisors:,} x {rate:g} | {accepted.label()} | {verdict(outcomes)} |"
        )
    errors = [f"- run {i}, {r.supervisors} x {r.rate_per_supervisor:g}: {r.first_error}"
              for i, r in runs if r.first_error]  # fmt: skip
    return "\n\n".join(
        p
        for p in [
            "\n".join(summary),
            "Every run:",
            "\n".join(rows),
            ("First errors:\n" + "\n".join(errors)) if errors else "",
            "CPU is % of one core (200 % = both cores of this machine).",
        ]
        if p
    )


SECTION = Section(
    name="tracker",
    module="bench.tracker_bench",
    title="Tracker: blocks from 1,000 simulated supervisors, through the real endpoint",
    render=render,
    about=doc_tail(__doc__),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.tracker_bench", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="smoke: 100 x 5 blocks/s, 3 s, 1 run")
    p.add_argument("--supervisors", type=int, help="simulated supervisors (1000; quick 100)")
    p.add_argument("--rates", help="AddBlock/s per supervisor, comma-separated (5,6; quick 5)")
    p.add_argument("--seconds", type=float, help="the send window (20; quick 3)")
    p.add_argument("--clients", type=int, default=4, help="client processes")
    p.add_argument("--repeats", type=int, help=f"runs of each rate ({DEFAULT_REPEATS}; quick 1)")
    add_record_arguments(p)
    args = p.parse_args(argv)
    supervisors = args.supervisors or (100 if args.quick else 1000)
    rates = [float(x) for x in (args.rates or ("5" if args.quick else "5,6")).split(",") if x]
    seconds = args.seconds or (3.0 if args.quick else 20.0)
    repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    if repeats < 1 or not rates or min(rates) <= 0 or supervisors < 1:
        p.error("--repeats and --supervisors must be >= 1 and every rate > 0")
    runs: list[dict[str, Any]] = []
    with Recording(SECTION, "python -m bench.tracker_bench", argv, args) as rec:
        for repeat in range(1, repeats + 1):
            for rate in rates:
                r = run(supervisors, rate, seconds, args.clients)
                runs.append({**asdict(r), "repeat": repeat})
                print(
                    f"run {repeat}: {r.supervisors} x {rate:g}/s: {r.steady_accepted_rate:,.0f} "
                    f"blocks/s accepted in the steady window ({'meets' if r.meets() else 'misses'}"
                    f" the target); {r.completed_rate:,.0f}/s answered in the window in "
                    f"{r.calls_rate:,.0f} AddBlocks calls/s (offered {r.offered_rate:,.0f}/s, "
                    f"failed {r.failed}), latency p50 {_ms(r.latency_p50_ms)} p99 "
                    f"{_ms(r.latency_p99_ms)} ms, driver CPU {r.driver_cpu_pct:.0f} %",
                    flush=True,
                )
                if r.first_error:
                    print(f"  first error: {r.first_error}", flush=True)
    data = {
        "supervisors": supervisors,
        "rates": rates,
        "seconds": seconds,
        "clients": args.clients,
        "target_per_s": TARGET_PER_S,
        "runs": runs,
    }
    print(render(data), flush=True)
    rec.finish(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
