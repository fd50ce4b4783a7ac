"""Issue 33's cost check: the ladder's line count fed through Redis, positions on vs off.

    python -m bench.redis_positions                         # 2 rounds, on/off alternating
    python -m bench.redis_positions --rounds 1 --lowest 20000 --highest 60000 --seconds 8

The load generator of the throughput ladder (``LineSource``, paced, open loop, its clock
starting at the connection) offers its lines to a **feed** in the child's driver process,
which passes each one on to a ``redis-server`` started for the session as ``XADD lines
MAXLEN ~ 2000000 * value <line>`` (pipelined, the replies read on a thread of their own);
the stream's receiver reads them through a consumer group and the ``ingest`` pipeline (or
``--pipeline``) runs on each batch, receiver WAL and driver WAL on (a checkpoint), as
exactly-once needs them. The two systems differ only in the receiver:

- ``redis_positions``: :class:`~spark_receivers.receivers.redis_stream.RedisStreamReceiver`
  as shipped: every batch stored with its entry-id range as its position (``position=``), the
  driver keeping the newest in its WAL and every cleanup event;
- ``redis_no_positions``: :class:`RedisStreamReceiverWithoutPositions`, the same receiver
  storing each batch without a position (no id range computed, nothing for the driver to
  keep): at least once, what it did before issue 33.

Each session is a fresh JVM that climbs the same geometric rungs (``bench.ladder.rung_grid``,
1.25x apart, or ``--spacing``) until its first unsustained step, judged by the ladder's own
rule (``bench.harness.summarize_step`` through ``bench.step.run_child_session``). Sessions
alternate (on, off, off, on, ...) so a drift in the shared machine's load hits both alike; a
round's capacity ratio on/off is the range its rungs allow: ``[on held / off failed, on
failed / off held]``, never one number. Its lower end is 1 / spacing when both fail the same
rung: at 1.25x rungs it reaches 0.95 only when "on" holds a rung "off" failed, while
``--spacing 1.05`` (or finer) lets a tie show ">= 0.95x" (start ``--lowest`` near the
capacity: a finer grid has more rungs to climb). The 1-minute load average of every step is
printed.
Nothing is written into BENCHMARKS.md (no section of its own); the raw sessions go to
``bench/out/``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from typing import Any

from bench.child import BatchRecorder, ChildArgs, Stop, child_main
from bench.harness import Runner, StepResult
from bench.ladder import RUNG_RATIO, rung_grid
from bench.record import SCRATCH_DIR
from bench.step import run_child_session
from spark_receivers.receivers.redis_stream import RedisStreamReceiver

__all__ = [
    "SYSTEMS",
    "RedisFeed",
    "RedisStreamReceiverWithoutPositions",
    "main",
    "round_bounds",
    "run_redis_no_positions",
    "run_redis_positions",
]

STREAM = "lines"
GROUP = "bench"
MAXLEN = 2_000_000
"""``XADD ... MAXLEN ~``: bounds redis-server's memory (about 250 MB of 100-byte lines); a
receiver behind by that much has failed its step long before."""
MODES = ("redis_positions", "redis_no_positions")
DEFAULT_ROUNDS = 2
DEFAULT_LOWEST = 20_000
DEFAULT_HIGHEST = 200_000
DEFAULT_STEP_S = 8.0


class RedisStreamReceiverWithoutPositions(RedisStreamReceiver):
    """The Redis receiver storing its batches without a position (the bench's "off" peer).

    Everything else is the shipped receiver's: the same reads, Arrow column, reliable store
    and ``XACK``. No entry-id range is computed and the driver keeps no position, so at a
    restart its own pending entries are all stored again (at least once).
    """

    def _store_then_ack(
        self, client: Any, records: Any, times: list[int] | None, ids: list[str]
    ) -> None:
        if len(records):
            if times is None and self.include_timestamp:
                times = [int(i.partition("-")[0]) * 1000 for i in ids]
            self.store_records(records, reliable=True, times_us=times)
            self.records_stored += len(records)
        if ids:
            self._ack(client, ids)


# -- child side -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisFeed:
    """A redis-server for one session, and the thread passing the load generator's lines on.

    Lifecycle: constructed (the server started and answering) → :meth:`open` (connected to
    the load generator; one ``redis-feed`` thread reads its lines and writes ``XADD``s, one
    ``redis-feed-replies`` thread reads the replies) → :meth:`close` (both threads ended, the
    server stopped). The feed does the same work for both systems, so it cancels out of
    their ratio.
    """

    def __init__(self, positions: bool, *, start_timeout_s: float = 30.0) -> None:
        self.positions = positions
        self.port = _free_port()
        self._dir = tempfile.mkdtemp(prefix="bench-redis-positions-")
        self._server = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self._dir,
            ],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        self._redis: socket.socket | None = None
        self._source: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()
        self.lines_fed = 0
        self.error_replies = 0
        self.feed_error: str | None = None
        deadline = time.monotonic() + start_timeout_s
        while not self._answers():
            if time.monotonic() > deadline or self._server.poll() is not None:
                self._stop_server()
                msg = f"redis-server on port {self.port} did not answer in {start_timeout_s} s"
                raise RuntimeError(msg)
            time.sleep(0.05)  # another process: nothing to wait on but its port

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def receiver(self) -> RedisStreamReceiver:
        """The stream's receiver: positions on or off (see the module doc)."""
        kind = RedisStreamReceiver if self.positions else RedisStreamReceiverWithoutPositions
        return kind(STREAM, GROUP, url=f"redis://127.0.0.1:{self.port}/0", block_ms=100)

    def open(self, host: str, port: int) -> None:
        """Connect to the load generator (its clock starts now) and start passing lines."""
        self._redis = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self._redis.settimeout(None)
        self._source = socket.create_connection((host, port), timeout=30)
        self._source.settimeout(None)
        self._threads = [
            threading.Thread(target=self._feed, name="redis-feed", daemon=True),
            threading.Thread(target=self._replies, name="redis-feed-replies", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _feed(self) -> None:
        # Runs on the redis-feed thread until the load generator closes or close() is called.
        assert self._source is not None and self._redis is not None
        head = b"*8\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$6\r\nMAXLEN\r\n$1\r\n~\r\n$%d\r\n%d\r\n" % (
            len(STREAM), STREAM.encode(), len(str(MAXLEN)), MAXLEN,
        )  # fmt: skip
        head += b"$1\r\n*\r\n$5\r\nvalue\r\n"
        rest = b""
        try:
            while not self._closing.is_set():
                chunk = self._source.recv(1 << 20)
                if not chunk:
                    break
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                if lines:
                    self._redis.sendall(
                        b"".join(b"%s$%d\r\n%s\r\n" % (head, len(x), x) for x in lines)
                    )
                    self.lines_fed += len(lines)
        except OSError as e:
            if not self._closing.is_set():
                self.feed_error = f"{type(e).__name__}: {e}"

    def _replies(self) -> None:
        # Runs on the redis-feed-replies thread: XADD replies are ids ("$N\r\n<ms>-<seq>\r\n"),
        # so a line starting with "-" is an error reply.
        assert self._redis is not None
        previous = b"\n"
        try:
            while True:
                data = self._redis.recv(1 << 20)
                if not data:
                    return
                self.error_replies += (previous[-1:] + data).count(b"\n-")
                previous = data
        except OSError:
            return

    def close(self) -> dict[str, Any]:
        """Stop the threads and the server; what the feed counted."""
        self._closing.set()
        for s in (self._source, self._redis):
            if s is not None:
                with contextlib.suppress(OSError):  # already closed by its peer
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        for t in self._threads:
            t.join(10)
        self._stop_server()
        return {
            "positions": self.positions,
            "lines_fed": self.lines_fed,
            "error_replies": self.error_replies,
            "feed_error": self.feed_error,
        }

    def _stop_server(self) -> None:
        self._server.terminate()
        try:
            self._server.wait(10)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait(10)
        shutil.rmtree(self._dir, ignore_errors=True)


def _pipeline(positions: bool, args: ChildArgs, recorder: BatchRecorder) -> Stop:
    from bench.receivers import _spark_receivers

    feed = RedisFeed(positions)
    try:
        return _spark_receivers(args, recorder, wal=True, feed=feed)
    except BaseException:
        feed.close()
        raise


CHILD_PIPELINES = {
    "redis_positions": partial(_pipeline, True),
    "redis_no_positions": partial(_pipeline, False),
}

# -- parent side ------------------------------------------------------------------------------

run_redis_positions: Runner = partial(run_child_session, "redis_positions", "bench.redis_positions")
"""The Redis-fed ladder, receiver storing positions (as shipped), one session."""

run_redis_no_positions: Runner = partial(
    run_child_session, "redis_no_positions", "bench.redis_positions"
)
"""The Redis-fed ladder, receiver storing no positions, one session."""

SYSTEMS: dict[str, Runner] = {
    "redis_positions": run_redis_positions,
    "redis_no_positions": run_redis_no_positions,
}


def held(steps: list[dict[str, Any]]) -> int:
    """The highest sustained offered rate of a session (0 when none was)."""
    return max((s["offered_rate"] or 0 for s in steps if s["sustained"]), default=0)


def failed(steps: list[dict[str, Any]]) -> int | None:
    """The lowest offered rate a session did not sustain (None: it held every rung)."""
    return min((s["offered_rate"] for s in steps if not s["sustained"]), default=None)


def round_bounds(sessions: list[dict[str, Any]]) -> dict[int, list[float | None]]:
    """Per round, the capacity ratio positions on / off as the range the rungs allow.

    ``[on held / off failed, on failed / off held]``; None where that end is unbounded (a
    session that held every rung, or none).
    """
    out: dict[int, list[float | None]] = {}
    for r in dict.fromkeys(s["round"] for s in sessions):
        by = {s["system"]: s["steps"] for s in sessions if s["round"] == r}
        if set(by) != set(MODES):
            continue
        on, off = by["redis_positions"], by["redis_no_positions"]
        off_failed, on_failed, off_held = failed(off), failed(on), held(off)
        lo = held(on) / off_failed if off_failed else None
        hi = on_failed / off_held if on_failed and off_held else None
        out[int(r)] = [lo, hi]
    return out


def _print_step(step: StepResult) -> None:
    print(
        f"  {step.system:20} {step.offered_rate or 0:>9,} lines/s  "
        f"{'held' if step.sustained else 'FAILED':6}  load 1m {step.extra.get('load_1m')}  "
        f"{step.reason[:100]}",
        flush=True,
    )


def run(
    grid: list[int], step_s: float, rounds: int, pipeline: str, budget_s: float | None
) -> list[dict[str, Any]]:
    """``rounds`` pairs of sessions, the order alternating; each climbs ``grid``."""
    sessions = []
    for i in range(rounds):
        order = MODES if i % 2 == 0 else tuple(reversed(MODES))
        for system in order:
            result = SYSTEMS[system](
                grid, step_s, pipeline=pipeline, budget_s=budget_s, on_step=_print_step
            )
            steps = [s.to_dict() for s in result.steps]
            sessions.append({"round": i + 1, "system": system, "steps": steps})
            print(
                f"round {i + 1} {system}: held {held(steps):,}, failed {failed(steps)}",
                flush=True,
            )
    return sessions


def _b(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def render(sessions: list[dict[str, Any]]) -> str:
    """The sessions' table and each round's ratio range, in Markdown."""
    lines = [
        "| round | system | held (lines/s) | failed (lines/s) | load 1m over its steps |",
        "|---:|---|---:|---:|---|",
    ]
    for s in sessions:
        loads = [x["extra"].get("load_1m") for x in s["steps"] if x.get("extra")]
        span = [x for x in loads if isinstance(x, int | float)]
        load = f"{min(span):.2f}-{max(span):.2f}" if span else "-"
        f = failed(s["steps"])
        lines.append(
            f"| {s['round']} | {s['system']} | {held(s['steps']):,} | "
            f"{'not reached' if f is None else f'{f:,}'} | {load} |"
        )
    bounds = round_bounds(sessions)
    per_round = "; ".join(f"round {r}: [{_b(a)}, {_b(b)}]" for r, (a, b) in bounds.items())
    lines += ["", f"Capacity ratio positions on / off, by round: {per_round}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.redis_positions", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="on/off session pairs")
    p.add_argument("--lowest", type=int, default=DEFAULT_LOWEST, help="the lowest rung")
    p.add_argument("--highest", type=int, default=DEFAULT_HIGHEST, help="the top of the grid")
    p.add_argument("--seconds", type=float, default=DEFAULT_STEP_S, help="per step")
    p.add_argument(
        "--spacing",
        type=float,
        default=RUNG_RATIO,
        help="ratio of one rung to the one below (> 1); a tie bounds on/off at >= 1/spacing",
    )
    p.add_argument("--pipeline", default="ingest", help="ingest, wordcount or two_action")
    p.add_argument("--session-budget-s", type=float, default=None, help="cap per session")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.spacing <= 1:
        p.error(f"--spacing must be > 1, got {args.spacing}")
    grid = rung_grid(args.lowest, args.highest, args.spacing)
    started = dt.datetime.now(dt.UTC)
    print(f"rungs: {grid}; load average at start: {os.getloadavg()}", flush=True)
    sessions = run(grid, args.seconds, args.rounds, args.pipeline, args.session_budget_s)
    table = render(sessions)
    print("\n" + table, flush=True)
    SCRATCH_DIR.mkdir(parents=True, exist_ok=True)
    raw = SCRATCH_DIR / f"redis_positions-{started.strftime('%Y%m%dT%H%M%S')}.json"
    raw.write_text(
        json.dumps(
            {
                "started": started.isoformat(),
                "argv": sys.argv[1:] if argv is None else argv,
                "grid": grid,
                "load_at_end": os.getloadavg(),
                "sessions": sessions,
            },
            indent=1,
        )
    )
    print(f"raw sessions: {raw}; load average at end: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in CHILD_PIPELINES:
        sys.exit(child_main(CHILD_PIPELINES))
    sys.exit(main())
