"""Cold start: the scheduling delay of the first batches, as users start a stream (issues 20, 34).

    python -m bench.cold_start                 # DStream, spark-receivers, and through Connect
    python -m bench.cold_start --quick         # smoke: 50k lines/s for 15 s
    python -m bench.cold_start --systems spark_receivers,spark_receivers_connect --repeats 3

Each system runs the two-action word count (``count()`` then the word count, on each 1 s
batch; DStream: two output operations) in a fresh subprocess (``local[4]``), started
**as users start it**: no warm-up job before the stream, the receiver connects to the load
generator as soon as it runs, and the load generator offers the full rate from its first
second. The same child processes as the throughput ladder (``bench/peers.py``,
``bench/receivers.py`` with ``--cold``); with ``--repeats N`` the systems take turns, N
times, so that each repeat of one system runs in the same minutes as the others'.

What is timed as **start-up to the first batch**: from just before the user's program asks
for its Spark session to the completion of the first batch that processed lines. For
`spark_receivers` that includes starting the JVM (`getOrCreate()` of a classic session),
then the context's `start()`, the receiver's launch and the first batch. A Spark Connect
user joins a server that is already running, so for `spark_receivers_connect` the child
starts the Connect server (`local[4]`, the same settings) **before** that clock starts and
the clock covers the client session, `start()`, the receiver's launch on the server and the
first batch; the server's own start (spawn to listening) is reported apart, in its own
column, and not counted (issue 34's target: Connect's start-up ≤ 1.5x the classic one's).

Reported per system and repeat: the server's start (Connect), the session's creation, how
long ``start()`` took (spark-receivers), start-up to the first batch, the first batch's
processing time, the largest scheduling delay, and **steady from**: the time after the first
record from which every later batch's scheduling delay stays under one batch interval
(issue 20's target: within 15 s, and no later than DStream's). The plot shows every
batch's scheduling delay against its batch time, from the first record (each system's
first repeat).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.record import REPO_ROOT, Recording, RunInfo, Section, add_record_arguments, doc_tail
from bench.step import run_child_session

__all__ = ["SECTION", "ColdRun", "render", "startup_verdict", "steady_from"]

SYSTEMS = {
    "dstream": "bench.peers",
    "spark_receivers": "bench.receivers",
    "spark_receivers_connect": "bench.receivers",
}
TARGET_STEADY_S = 15.0
TARGET_CONNECT_STARTUP = 1.5
"""Issue 34: start-up to the first batch through Connect ≤ 1.5x the classic session's."""
PNG = REPO_ROOT / "docs" / "img" / "cold_start.png"


@dataclass(frozen=True)
class ColdRun:
    """One system's cold start: every batch as ``(time after first record s, delay ms,
    processing ms, lines)``, and what the session reported."""

    system: str
    rate: int
    seconds: float
    interval_ms: float
    batches: list[tuple[float, float, float, int]]
    lines_sent: int
    extra: dict[str, Any]
    error: str | None = None
    repeat: int = 1

    @property
    def first_batch_after_s(self) -> float | None:
        """Start-up to the first batch that processed lines (see the module doc)."""
        value = self.extra.get("startup", {}).get("first_batch_after_s")
        return None if value is None else float(value)

    @property
    def lines_processed(self) -> int:
        return sum(b[3] for b in self.batches)


def steady_from(batches: Sequence[tuple[float, float, float, int]], interval_ms: float) -> float:
    """The batch time (s after the first record) from which every delay stays < interval.

    ``inf`` when the last batch is still behind; the first batch time at or after the first
    record when none ever was.
    """
    after = [b for b in batches if b[0] >= 0]
    if not after:
        return float("inf")
    steady = after[0][0]
    for t, delay, _, _ in after:
        if delay >= interval_ms:
            steady = float("inf")
        elif steady == float("inf"):
            steady = t
    return steady


def run_cold(
    system: str, rate: int, seconds: float, interval_s: float = 1.0, repeat: int = 1
) -> ColdRun:
    """One cold session of ``system`` at ``rate`` for ``seconds``; blocks, bounded."""
    session = run_child_session(
        system,
        SYSTEMS[system],
        [rate],
        seconds,
        interval_s,
        pipeline="two_action",
        drain_batches=int(seconds),  # a backlog may take as long as the window to drain
        extra_args=("--cold",),
    )
    last = session.steps[-1]
    raw = json.loads((REPO_ROOT / str(last.extra["raw"])).read_text())
    t0 = raw["server"].get("started_at_s")
    batches = []
    for b in sorted(raw.get("batches", []), key=lambda b: b["batch_time_s"]):
        if t0 is None or b.get("scheduling_delay_ms") is None:
            continue
        batches.append(
            (
                b["batch_time_s"] - t0,
                float(b["scheduling_delay_ms"]),
                float(b["processing_ms"]),
                int(b.get("lines", 0)),
            )
        )
    return ColdRun(
        system=system,
        rate=rate,
        seconds=seconds,
        interval_ms=interval_s * 1000,
        batches=batches,
        lines_sent=int(raw["server"].get("lines_sent", 0)),
        extra={
            k: v
            for k, v in last.extra.items()
            if k in ("startup", "load_1m", "log", "connect_server")
        },
        error=last.error,
        repeat=repeat,
    )


def plot(runs: Sequence[ColdRun], path: Path) -> None:
    """Scheduling delay against batch time, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in [r for r in runs if r.repeat == 1]:
        ax.plot([b[0] for b in r.batches], [b[1] / 1000 for b in r.batches], marker=".",
                label=r.system)  # fmt: skip
    if runs:
        ax.axhline(runs[0].interval_ms / 1000, color="grey", linestyle="--", label="1 interval")
    ax.axvline(TARGET_STEADY_S, color="grey", linestyle=":", label=f"{TARGET_STEADY_S:g} s")
    ax.set_xlabel("batch time, s after the first record")
    ax.set_ylabel("scheduling delay, s")
    rate = runs[0].rate if runs else 0
    ax.set_title(f"Cold start: two-action word count, {rate:,} lines/s from the first second")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _s(x: float) -> str:
    return "never" if x == float("inf") else f"{x:.1f} s"


def _runs(data: dict[str, Any]) -> list[ColdRun]:
    return [ColdRun(**{**r, "batches": [tuple(b) for b in r["batches"]]}) for r in data["runs"]]


def _secs(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} s"


def startup_verdict(runs: Sequence[ColdRun]) -> str:
    """Issue 34's start-up target over the repeats: Connect's ÷ the classic session's.

    A range, from the lowest Connect time over the highest classic one to the highest over
    the lowest; met when all of it is at most :data:`TARGET_CONNECT_STARTUP`, not met when
    none of it is, undecided otherwise. '' when either system has no time.
    """
    ours = [r.first_batch_after_s for r in runs if r.system == "spark_receivers"]
    connect = [r.first_batch_after_s for r in runs if r.system == "spark_receivers_connect"]
    a = [x for x in connect if x is not None]
    b = [x for x in ours if x is not None]
    if not a or not b:
        return ""
    lo, hi = min(a) / max(b), max(a) / min(b)
    median = statistics.median(a) / statistics.median(b)
    if hi <= TARGET_CONNECT_STARTUP:
        verdict = "met"
    elif lo > TARGET_CONNECT_STARTUP:
        verdict = "**not met**"
    else:
        verdict = "undecided (the range straddles it)"
    return (
        f"Start-up to the first batch, Connect ÷ classic ≤ {TARGET_CONNECT_STARTUP:g}x: "
        f"{verdict}: [{lo:.2f}x, {hi:.2f}x] over {len(a)} Connect and {len(b)} classic "
        "repeats (medians "
        f"{statistics.median(a):.1f} s ÷ {statistics.median(b):.1f} s = {median:.2f}x); the "
        "Connect server's own start is not in it (its column)."
    )


def render(data: dict[str, Any]) -> str:
    """The ``cold_start`` section's body from a run's raw data."""
    runs = _runs(data)
    rows = [
        "| system | repeat | Connect server start (apart) | session | start() took "
        "| start-up to first batch | first batch processing | max scheduling delay "
        f"| steady from (delay < 1 interval for good) | within {TARGET_STEADY_S:g} s "
        "| processed / sent | load 1m |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    steady: dict[str, list[float]] = {}
    for r in runs:
        first = next((b[2] for b in r.batches if b[3] > 0), None)
        startup = r.extra.get("startup", {})
        server = r.extra.get("connect_server", {}).get("start_s")
        st = steady_from(r.batches, r.interval_ms)
        steady.setdefault(r.system, []).append(st)
        rows.append(
            f"| {r.system} | {r.repeat} | {_secs(server)} | {_secs(startup.get('session_s'))} "
            f"| {_secs(startup.get('start_returned_after_s'))} | {_secs(r.first_batch_after_s)} "
            f"| {'-' if first is None else f'{first:,.0f} ms'} "
            f"| {max((b[1] for b in r.batches), default=0):,.0f} ms | {_s(st)} "
            f"| {'yes' if st <= TARGET_STEADY_S else '**no**'} "
            f"| {r.lines_processed:,} / {r.lines_sent:,} | {r.extra.get('load_1m', '-')} |"
        )
    verdict = ""
    if "dstream" in steady and "spark_receivers" in steady:
        ours, theirs = max(steady["spark_receivers"]), min(steady["dstream"])
        ok = ours <= theirs
        verdict = (
            f"Time to steady state, spark-receivers ≤ DStream: {'yes' if ok else '**no**'} "
            f"(slowest {_s(ours)} vs fastest {_s(theirs)})."
        )
    errors = [f"- {r.system} (repeat {r.repeat}): {r.error}" for r in runs if r.error]
    parts = [
        "\n".join(rows),
        verdict,
        startup_verdict(runs),
        ("Errors:\n" + "\n".join(errors)) if errors else "",
        f"![scheduling delay over time, from the first record]({PNG.relative_to(REPO_ROOT)})",
    ]
    return "\n\n".join(p for p in parts if p)


def _plot(data: dict[str, Any], info: RunInfo) -> None:
    plot(_runs(data), PNG)
    print(f"wrote {PNG.relative_to(REPO_ROOT)}")


SECTION = Section(
    name="cold_start",
    module="bench.cold_start",
    title="Cold start (issue 20)",
    render=render,
    about=doc_tail(__doc__),
    also_write=_plot,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.cold_start", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="50k lines/s for 15 s")
    p.add_argument("--rate", type=int)
    p.add_argument("--seconds", type=float)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--repeats", type=int, default=1, help="runs of each system, taking turns")
    add_record_arguments(p)
    args = p.parse_args(argv)
    rate = args.rate or (50_000 if args.quick else 200_000)
    seconds = args.seconds or (15.0 if args.quick else 40.0)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    runs = []
    with Recording(SECTION, "python -m bench.cold_start", argv, args) as rec:
        for repeat in range(1, args.repeats + 1):
            for system in [s for s in args.systems.split(",") if s]:
                r = run_cold(system, rate, seconds, repeat=repeat)
                runs.append(r)
                print(
                    f"{system} #{repeat}: start-up to first batch {_secs(r.first_batch_after_s)}"
                    f", steady from {_s(steady_from(r.batches, r.interval_ms))}, max delay "
                    f"{max((b[1] for b in r.batches), default=0):,.0f} ms, processed "
                    f"{r.lines_processed:,}/{r.lines_sent:,}"
                    + (f", error: {r.error}" if r.error else ""),
                    flush=True,
                )
        verdict = startup_verdict(runs)
        if verdict:
            print(verdict, flush=True)
    rec.finish({"rate": rate, "seconds": seconds, "runs": [asdict(r) for r in runs]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
