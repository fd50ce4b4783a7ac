"""Issue 7's acceptance run: a socket source offering 3x what a slow pipeline processes.

    python -m bench.backpressure                 # 2 x 2 minutes, writes the section and PNG
    python -m bench.backpressure --quick         # smoke: 2 x 30 s
    python -m bench.backpressure --seconds 10 --no-write

A :class:`~spark_receivers.receivers.line_source.LineSource` offers ``--offered`` lines/s
(30,000) to a ``SocketTextReceiver``; the output operation counts each batch and then sleeps one
second per ``--capacity`` rows (10,000/s), so the pipeline cannot process more than a
third of the offer. 1 s batches, 200 ms blocks. Two runs of ``--seconds`` each, in
fresh contexts of one SparkSession: backpressure on (PID, initial rate = half the
nominal capacity: the pipeline's real capacity is below it, by Spark's per-batch cost),
then off. Every second a sampler records what the source sent, the receiver's rate
limit (the rate controller's latest estimate) and the records held in receivers'
stores (received by the tracker minus processed by completed batches); a listener
records every batch. After the window the source closes its connection; the "on" run
then waits until the receiver got every line and stops gracefully, so the processed
count can be compared with the sent count exactly. The "off" run stops at once.

Verdict, "on": after the warm-up (first 20 %) every scheduling delay < 2 batch
intervals; records held in the second half no higher than 1.5 x the first half's
maximum (bounded); processed == sent. "off": the delay of the last three completed
batches exceeds 5 batch intervals and every delay of the first quarter (it grows).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from bench.record import REPO_ROOT, Recording, RunInfo, Section, add_record_arguments

PNG = REPO_ROOT / "docs" / "img" / "backpressure.png"
BATCH_MS = 1000


def run_once(spark: Any, backpressure: bool, offered: int, capacity: int, seconds: float) -> dict:
    from spark_receivers import (
        SocketTextReceiver,
        StreamingConfig,
        StreamingContext,
        StreamingListener,
    )
    from spark_receivers.receivers.line_source import LineSource

    batches: list[dict[str, Any]] = []

    class Batches(StreamingListener):
        def on_batch_completed(self, info: Any) -> None:
            batches.append(
                {
                    "t": info.batch_time_ms,
                    "records": info.num_records,
                    "processing_ms": info.processing_delay_ms,
                    "scheduling_ms": info.scheduling_delay_ms,
                }
            )

    def slow(df: Any, batch_time_ms: int) -> None:
        time.sleep(df.count() / capacity)

    server = LineSource(offered, seconds).start()
    config = StreamingConfig(
        block_interval_ms=200,
        backpressure_enabled=backpressure,
        backpressure_initial_rate=capacity / 2 if backpressure else 0.0,
        receiver_drain_timeout_s=30.0,
    )
    ssc = StreamingContext(spark, BATCH_MS, config=config)
    ssc.add_streaming_listener(Batches())
    ssc.receiver_stream(SocketTextReceiver("127.0.0.1", server.port)).foreach_batch(slow)
    ssc.start()
    samples: list[dict[str, Any]] = []
    stop_sampling = threading.Event()

    def sample() -> None:
        t0 = time.time()
        while not stop_sampling.wait(1.0):
            status = ssc.status()
            received = status.records_received
            processed = sum(b["records"] for b in batches)
            samples.append(
                {
                    "s": time.time() - t0,
                    "sent": server.info().lines_sent,
                    "received": received,
                    "held": received - processed,
                    "rate_limit": status.rate_limits.get(0),
                }
            )

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.time()
    server.wait_finished(seconds + 120)
    sent = server.info().lines_sent
    if backpressure:
        deadline = time.time() + 120
        while ssc.status().records_received < sent and time.time() < deadline:
            time.sleep(0.2)
        ssc.stop(graceful=True)
    else:
        ssc.stop(graceful=False)
    stop_sampling.set()
    sampler.join()
    processed = sum(b["records"] for b in batches)
    for b in batches:
        b["s"] = b["t"] / 1000 - started
    return {
        "backpressure": backpressure,
        "offered": offered,
        "capacity": capacity,
        "seconds": seconds,
        "sent": sent,
        "processed": processed,
        "batches": batches,
        "samples": samples,
    }


def verdict(run: dict[str, Any]) -> dict[str, Any]:
    """The acceptance checks of one run (see the module doc)."""
    seconds = run["seconds"]
    batches = [b for b in run["batches"] if b["scheduling_ms"] is not None]
    late = [b["scheduling_ms"] for b in batches if b["s"] >= 0.2 * seconds]
    held = [(s["s"], s["held"]) for s in run["samples"] if s["s"] <= seconds]
    first = [h for s, h in held if s < seconds / 2]
    second = [h for s, h in held if s >= seconds / 2]
    out: dict[str, Any] = {
        "max_delay_after_warmup_ms": max(late, default=None),
        "held_max_first_half": max(first, default=0),
        "held_max_second_half": max(second, default=0),
    }
    if run["backpressure"]:
        out["delay_bounded"] = bool(late) and max(late) < 2 * BATCH_MS
        out["memory_bounded"] = out["held_max_second_half"] <= 1.5 * max(
            1, out["held_max_first_half"]
        )
        out["nothing_dropped"] = run["processed"] == run["sent"]
        out["ok"] = out["delay_bounded"] and out["memory_bounded"] and out["nothing_dropped"]
    else:
        quarter = [b["scheduling_ms"] for b in batches if b["s"] <= 0.25 * seconds]
        end = [b["scheduling_ms"] for b in batches[-3:]]  # the last batches that completed
        grows = bool(end) and min(end) > 5 * BATCH_MS and min(end) > max(quarter, default=0)
        out["delay_grows"] = grows
        out["ok"] = grows
    return out


def render_table(runs: list[dict[str, Any]]) -> str:
    rows = [
        "| backpressure | sent | processed | max sched. delay after warm-up "
        "| held max (1st / 2nd half) | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        v = verdict(r)
        delay = v["max_delay_after_warmup_ms"]
        if r["backpressure"]:
            checks = (
                f"delay < 2 batches: {'yes' if v['delay_bounded'] else 'NO'}; "
                f"memory bounded: {'yes' if v['memory_bounded'] else 'NO'}; "
                f"processed == sent: {'yes' if v['nothing_dropped'] else 'NO'}"
            )
        else:
            checks = f"delay grows: {'yes' if v['delay_grows'] else 'NO'}"
        rows.append(
            f"| {'on' if r['backpressure'] else 'off'} | {r['sent']:,} | {r['processed']:,} "
            f"| {'-' if delay is None else f'{delay / 1000:.1f} s'} "
            f"| {v['held_max_first_half']:,} / {v['held_max_second_half']:,} | {checks} |"
        )
    return "\n".join(rows)


def plot(runs: list[dict[str, Any]], path: Any) -> None:
    """Offered and sent rate, rate limit, processed rate and scheduling delay over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(runs), figsize=(6 * len(runs), 7), sharex=True, squeeze=False)
    for col, r in enumerate(runs):
        top, bottom = axes[0][col], axes[1][col]
        s = r["samples"]
        xs = [x["s"] for x in s]
        sent_rate = [
            max(0, b["sent"] - a["sent"]) for a, b in zip([{"sent": 0}, *s], s, strict=False)
        ]
        top.axhline(r["offered"], color="grey", linestyle=":", label="offered")
        top.plot(xs, sent_rate, label="sent by the source")
        limits = [x["rate_limit"] for x in s]
        if any(v is not None for v in limits):
            top.plot(xs, [v if v is not None else float("nan") for v in limits], label="rate limit")
        top.plot(
            [b["s"] for b in r["batches"]],
            [b["records"] for b in r["batches"]],
            label="processed per batch",
        )
        top.set_title(f"backpressure {'on' if r['backpressure'] else 'off'}")
        top.set_ylabel("lines/s")
        top.legend(loc="upper right", fontsize=8)
        bottom.plot(
            [b["s"] for b in r["batches"]],
            [(b["scheduling_ms"] or 0) / 1000 for b in r["batches"]],
            label="scheduling delay (s)",
        )
        bottom.axhline(2, color="grey", linestyle=":", label="2 batch intervals")
        bottom.set_xlabel("seconds")
        bottom.set_ylabel("seconds")
        bottom.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def render(runs: list[dict[str, Any]]) -> str:
    """The ``backpressure`` section's body from a run's raw data (its two runs)."""
    first = runs[0]
    return "\n\n".join(
        [
            f"A socket source offers {first['offered']:,} lines/s for {first['seconds']:.0f} s "
            f"to a pipeline that processes {first['capacity']:,} rows/s (the output operation "
            "sleeps one second per that many rows); 1 s batches. Checks are described in "
            '`bench/backpressure.py`; "held" is records received but not yet processed (in the '
            "receivers' block stores).",
            render_table(runs),
            f"![offered, sent, rate limit, processed and delay over time]"
            f"({PNG.relative_to(REPO_ROOT)})",
        ]
    )


def _plot(runs: list[dict[str, Any]], info: RunInfo) -> None:
    plot(runs, PNG)
    print(f"wrote {PNG.relative_to(REPO_ROOT)}")


SECTION = Section(
    name="backpressure",
    module="bench.backpressure",
    title="Backpressure (issue 7)",
    render=render,
    also_write=_plot,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.backpressure", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="30 s runs")
    p.add_argument("--seconds", type=float, help="per run (120; quick 30)")
    p.add_argument("--offered", type=int, default=30_000)
    p.add_argument("--capacity", type=int, default=10_000)
    add_record_arguments(p)
    args = p.parse_args(argv)
    seconds = args.seconds or (30.0 if args.quick else 120.0)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    with Recording(SECTION, "python -m bench.backpressure", argv, args) as rec:
        spark = (
            SparkSession.builder.master("local[4]")
            .appName("backpressure-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            runs = [
                run_once(spark, bp, args.offered, args.capacity, seconds) for bp in (True, False)
            ]
        finally:
            spark.stop()
    print(render_table(runs), flush=True)
    rec.finish(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
