"""Cold start: the scheduling delay of the first batches, as users start a stream (issue 20).

    python -m bench.cold_start                 # DStream and spark-receivers, 200k lines/s, 40 s
    python -m bench.cold_start --quick         # smoke: 50k lines/s for 15 s
    python -m bench.cold_start --systems spark_receivers --seconds 10 --no-write

Each system runs the two-action word count (``count()`` then the word count, on each 1 s
batch; DStream: two output operations) in a fresh subprocess and JVM (``local[4]``), started
**as users start it**: no warm-up job before the stream, the receiver connects to the load
generator as soon as it runs, and the load generator offers the full rate from its first
second. The same child processes as the throughput ladder (``bench/peers.py``,
``bench/receivers.py`` with ``--cold``).

Reported per system: how long ``start()`` took (spark-receivers), the first batch's
processing time, the largest scheduling delay, and **steady from**: the time after the first
record from which every later batch's scheduling delay stays under one batch interval
(the issue's target: within 15 s, and no later than DStream's). The plot shows every
batch's scheduling delay against its batch time, from the first record.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.record import REPO_ROOT, Recording, RunInfo, Section, add_record_arguments, doc_tail
from bench.step import run_child_session

__all__ = ["SECTION", "ColdRun", "render", "steady_from"]

SYSTEMS = {"dstream": "bench.peers", "spark_receivers": "bench.receivers"}
TARGET_STEADY_S = 15.0
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


def run_cold(system: str, rate: int, seconds: float, interval_s: float = 1.0) -> ColdRun:
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
        extra={k: v for k, v in last.extra.items() if k in ("startup", "load_1m", "log")},
        error=last.error,
    )


def plot(runs: Sequence[ColdRun], path: Path) -> None:
    """Scheduling delay against batch time, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in runs:
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


def render(data: dict[str, Any]) -> str:
    """The ``cold_start`` section's body from a run's raw data."""
    runs = _runs(data)
    rows = [
        "| system | start() took | first batch processing | max scheduling delay "
        f"| steady from (delay < 1 interval for good) | within {TARGET_STEADY_S:g} s "
        "| processed / sent | load 1m |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    steady = {r.system: steady_from(r.batches, r.interval_ms) for r in runs}
    for r in runs:
        first = next((b[2] for b in r.batches if b[3] > 0), None)
        start = r.extra.get("startup", {}).get("start_returned_after_s")
        rows.append(
            f"| {r.system} | {'-' if start is None else f'{start:.1f} s'} "
            f"| {'-' if first is None else f'{first:,.0f} ms'} "
            f"| {max((b[1] for b in r.batches), default=0):,.0f} ms | {_s(steady[r.system])} "
            f"| {'yes' if steady[r.system] <= TARGET_STEADY_S else '**no**'} "
            f"| {r.lines_processed:,} / {r.lines_sent:,} | {r.extra.get('load_1m', '-')} |"
        )
    verdict = ""
    if "dstream" in steady and "spark_receivers" in steady:
        ok = steady["spark_receivers"] <= steady["dstream"]
        verdict = (
            f"Time to steady state, spark-receivers ≤ DStream: {'yes' if ok else '**no**'} "
            f"({_s(steady['spark_receivers'])} vs {_s(steady['dstream'])})."
        )
    errors = [f"- {r.system}: {r.error}" for r in runs if r.error]
    parts = [
        "\n".join(rows),
        verdict,
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
    add_record_arguments(p)
    args = p.parse_args(argv)
    rate = args.rate or (50_000 if args.quick else 200_000)
    seconds = args.seconds or (15.0 if args.quick else 40.0)
    runs = []
    with Recording(SECTION, "python -m bench.cold_start", argv, args) as rec:
        for system in [s for s in args.systems.split(",") if s]:
            r = run_cold(system, rate, seconds)
            runs.append(r)
            print(
                f"{system}: steady from {_s(steady_from(r.batches, r.interval_ms))}, max delay "
                f"{max((b[1] for b in r.batches), default=0):,.0f} ms, processed "
                f"{r.lines_processed:,}/{r.lines_sent:,}"
                + (f", error: {r.error}" if r.error else ""),
                flush=True,
            )
    rec.finish({"rate": rate, "seconds": seconds, "runs": [asdict(r) for r in runs]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
