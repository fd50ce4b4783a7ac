"""Repeated actions on one batch DataFrame: first vs second action, and the empty batch.

    python -m bench.repeated_actions                 # ~2.5 minutes, writes the section
    python -m bench.repeated_actions --quick         # smoke: 10 s per case
    python -m bench.repeated_actions --seconds 5 --no-write

What users write: several actions on the DataFrame of one batch (a ``count()`` and a word
count, a ``show()`` then a write...). Measured on ``local[4]`` in this process, with the
batch cache on (the default) and off (``spark.receivers.batch.cache=false``, how every
action re-read the blocks before), one after the other in the same run:

1. **Data batches**: a receiver stores ``--rate`` 100-byte lines per second (the ladder's
   lines, 1,000 per ``store`` call), 1 s batches; each batch's ``foreach_batch`` runs the
   word count (``explode(split)`` → ``groupBy`` → ``collect``), then the same word count
   again, then ``count()``; each action's wall time is taken in the callback. Reported: p50
   of each over the batches after a warm-up fifth, and second ÷ first. Then, as the floor
   no re-read can beat, the batch's rows are put in Spark's own memory
   (``localCheckpoint()``, not timed) and the same word count runs on them: what the query
   itself costs in Spark when no block is fetched again (the figure DStream's re-reads from
   the BlockManager aim at). Second ÷ floor near 1 means the second action pays only for its
   own query. These extra steps lengthen each batch.
2. **Empty batches**: a receiver that stores nothing; each batch runs ``count()`` and the
   word count; the batch's processing time (listener) p50 and p99.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from bench.child import local_session, warmup_lines
from bench.pipelines import word_count
from bench.record import REPO_ROOT, Recording, Section, add_record_arguments, doc_tail

__all__ = ["SECTION", "main", "render"]

EMPTY_TARGET_MS = 100.0  # issue 20: an empty batch with two actions


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_case(spark: Any, *, rate: int, seconds: float, cache: bool) -> dict[str, Any]:
    """One context: data batches at ``rate`` (0: empty batches); the measured figures."""
    import pyarrow as pa

    from spark_receivers import Receiver, StreamingConfig, StreamingContext, StreamingListener

    pool = pa.array(warmup_lines(10_000), pa.string())

    class Lines(Receiver):
        def on_start(self) -> None:
            if rate:
                threading.Thread(target=self._run, daemon=True).start()

        def on_stop(self) -> None:
            pass

        def _run(self) -> None:
            chunk, next_at, i = 1_000, time.monotonic(), 0
            while not self.is_stopped():
                start = (i * chunk) % (len(pool) - chunk)
                self.store(pa.record_batch([pool.slice(start, chunk)], names=["value"]))
                i += 1
                next_at += chunk / rate
                time.sleep(max(0.0, next_at - time.monotonic()))

    actions: dict[str, list[float]] = {"first": [], "second": [], "count": [], "floor": []}
    lines: list[int] = []
    batch_ms: list[float] = []
    started = time.monotonic()
    warm_up_s = seconds / 5

    class Batches(StreamingListener):
        def on_batch_completed(self, info: Any) -> None:
            if info.processing_delay_ms is not None and time.monotonic() - started > warm_up_s:
                batch_ms.append(float(info.processing_delay_ms))

    def timed(fn: Any, df: Any) -> float:
        t = time.monotonic()
        fn(df)
        return (time.monotonic() - t) * 1000

    def on_batch(df: Any, batch_time_ms: int) -> None:
        first = timed(word_count, df)
        second = timed(word_count, df) if rate else 0.0
        counted: list[int] = []
        count = timed(lambda d: counted.append(d.count()), df)
        floor = timed(word_count, df.localCheckpoint(eager=True)) if rate else 0.0
        if time.monotonic() - started > warm_up_s:
            lines.append(counted[0])
            actions["first"].append(first)
            actions["second"].append(second)
            actions["count"].append(count)
            actions["floor"].append(floor)

    config = StreamingConfig(batch_cache=cache)
    ssc = StreamingContext(spark, 1000, config=config)
    ssc.add_streaming_listener(Batches())
    ssc.receiver_stream(Lines()).foreach_batch(on_batch)
    ssc.start()
    ssc.await_termination(timeout_s=seconds)
    ssc.stop(graceful=False)
    out: dict[str, Any] = {"rate": rate, "cache": cache, "batches": len(actions["first"])}
    for key, values in actions.items():
        out[f"{key}_p50_ms"] = _p(values, 0.5)
    out["lines_p50"] = _p([float(n) for n in lines], 0.5)
    out["batch_p50_ms"] = _p(batch_ms, 0.5)
    out["batch_p99_ms"] = _p(batch_ms, 0.99)
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} ms"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def render(cases: list[dict[str, Any]]) -> str:
    """The ``repeated_actions`` section's body from a run's raw data (its cases)."""
    rows = [
        "| batch cache | lines/s | batches | lines per batch p50 | 1st word count p50 "
        "| 2nd word count p50 | 2nd ÷ 1st | word count on the rows in Spark's memory p50 "
        "| 2nd ÷ that | count() p50 | batch p50 / p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        if not c["rate"]:
            continue
        first, second = c["first_p50_ms"], c["second_p50_ms"]
        ratio = f"{second / first:.2f}" if first and second is not None else "-"
        floor = c.get("floor_p50_ms")
        over_floor = f"{second / floor:.2f}" if floor and second is not None else "-"
        rows.append(
            f"| {'on' if c['cache'] else 'off'} | {c['rate']:,} | {c['batches']} "
            f"| {_num(c.get('lines_p50'))} "
            f"| {_ms(first)} | {_ms(second)} | {ratio} | {_ms(floor)} | {over_floor} "
            f"| {_ms(c['count_p50_ms'])} "
            f"| {_ms(c['batch_p50_ms'])} / {_ms(c['batch_p99_ms'])} |"
        )
    empty = [
        f"| batch cache | batches | batch p50 | batch p99 | p50 ≤ {EMPTY_TARGET_MS:.0f} ms |",
        "|---|---:|---:|---:|---|",
    ]
    for c in cases:
        if c["rate"]:
            continue
        p50 = c["batch_p50_ms"]
        met = "-" if p50 is None else ("yes" if p50 <= EMPTY_TARGET_MS else "**no**")
        empty.append(
            f"| {'on' if c['cache'] else 'off'} | {c['batches']} | {_ms(p50)} "
            f"| {_ms(c['batch_p99_ms'])} | {met} |"
        )
    return "\n".join(
        [
            "Data batches:",
            "",
            "\n".join(rows),
            "",
            "Empty batches, two actions (`count()` and the word count):",
            "",
            "\n".join(empty),
        ]
    )


SECTION = Section(
    name="repeated_actions",
    module="bench.repeated_actions",
    title="Repeated actions on a batch (issue 20)",
    render=render,
    about=doc_tail(__doc__),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.repeated_actions", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="10 s per case")
    p.add_argument("--seconds", type=float, help="per case (25; quick 10)")
    p.add_argument("--rate", type=int, default=100_000, help="lines/s of the data batches")
    add_record_arguments(p)
    args = p.parse_args(argv)
    seconds = args.seconds or (10.0 if args.quick else 25.0)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        x for x in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if x
    )  # the Python workers import bench.* (the receiver class lives here)
    cases = []
    with Recording(SECTION, "python -m bench.repeated_actions", argv, args) as rec:
        spark = local_session("repeated-actions")
        try:
            for rate in (args.rate, 0):
                for cache in (False, True):
                    case = run_case(spark, rate=rate, seconds=seconds, cache=cache)
                    print(json.dumps(case), flush=True)
                    cases.append(case)
        finally:
            spark.stop()
    print(render(cases), flush=True)
    rec.finish(cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
