"""Issue 4's write-ahead log benchmarks, each against its target.

    python -m bench.wal_bench                  # ~4 minutes, writes the `wal` section
    python -m bench.wal_bench --quick          # smoke: 1 s writes, 8 s pipeline runs
    python -m bench.wal_bench --quick --pipeline-seconds 0 --no-write

1. **WAL write vs raw fsync**: ``FileBasedWriteAheadLog.write`` (framing, CRC, fdatasync
   per write) against a plain ``os.write`` + ``os.fdatasync`` loop of the same record sizes into
   the same directory, interleaved: MB/s and the ratio (target >= 0.7).
2. **Receiver block writes, direct vs buffered**: 8 MiB records (a block of ~80,000 100-byte
   lines: 200 ms at 400,000 lines/s) through ``FileBasedWriteAheadLog`` with and without
   ``direct_io`` (the receiver WAL's default since 2026-11-30: ``O_DIRECT`` from a reused
   aligned buffer), fsync on, in alternating rounds into one directory: this process's CPU
   (user + system, ``getrusage``) per GB and the MB/s of each. Target: direct costs no
   more CPU than buffered (the reason it is the default, decision 0021).
3. **Driver AddBlock/s with the batched WAL**: threads calling
   ``ReceivedBlockTracker.add_block`` concurrently on a batched driver WAL (fsync on, as
   configured by default): blocks/s and add latency p50/p99 (target >= 10,000/s).
4. **Recovery read rate**: blocks of 10,000 100-byte records written to a receiver WAL,
   then read back through their handles and decoded to Arrow, as WAL-backed reads do
   after a crash: records/s (target >= 1,000,000/s).
5. **Receiver throughput with the receiver WAL on vs off**: records stored one at a time,
   and Arrow batches, as fast as backpressure lets them through the whole pipeline on
   local Spark (``bench.store_pipeline --forms one,arrow --wal abba``: after a warm-up
   context that is not measured, off, on, on, off, so that a drift of the shared machine's
   speed hits both modes alike): mean rows/s per mode and the ratio (target >= 0.8). With the WAL on
   every byte is also written and fsync'd, so the rate cannot pass the disk's fsync'd
   bandwidth: Arrow batches reach it (blocks of tens of MB every 200 ms), so their row
   also gives the WAL's MB/s as a share of raw fsync'd writes of 64 MiB (row 1's third
   size, about the size of those blocks).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from bench.record import Recording, Section, add_record_arguments
from bench.step import REPO_ROOT

TARGETS = {
    "write_ratio": 0.7,
    "add_block_rate": 10_000,
    "recovery_rate": 1_000_000,
    "wal_ratio": 0.8,
}
BLOCK_BYTES = 8 << 20


def _cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_write(directory: str, size: int, seconds: float) -> dict[str, float]:
    """MB/s of raw fsync'd writes and of WAL writes of ``size``-byte records, interleaved."""
    from spark_receivers.wal import FileBasedWriteAheadLog

    payload = os.urandom(size)
    per_round = max(1, (8 << 20) // size)  # 8 records a round, but no more than 8 MiB
    raw_bytes = wal_bytes = 0
    raw_s = wal_s = 0.0
    raw_path = os.path.join(directory, f"raw-{size}")
    fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    log = FileBasedWriteAheadLog(os.path.join(directory, f"wal-{size}"), fsync=True)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for _ in range(per_round):  # rounds alternate, same disk
                t0 = time.perf_counter()
                os.write(fd, payload)
                os.fdatasync(fd)  # what the WAL calls (wal/_storage.py)
                raw_s += time.perf_counter() - t0
                raw_bytes += size
            for _ in range(per_round):
                t0 = time.perf_counter()
                log.write(payload, int(time.time() * 1000))
                wal_s += time.perf_counter() - t0
                wal_bytes += size
    finally:
        os.close(fd)
        log.close()
    raw = raw_bytes / raw_s / 1e6
    wal = wal_bytes / wal_s / 1e6
    return {"size": size, "raw_mb_s": raw, "wal_mb_s": wal, "ratio": wal / raw}


def bench_block_write(directory: str, seconds: float) -> dict[str, Any]:
    """CPU-s per GB and MB/s of 8 MiB WAL writes, buffered and direct, in alternating rounds."""
    from spark_receivers.wal import FileBasedWriteAheadLog

    payload = os.urandom(BLOCK_BYTES)
    logs = {
        mode: FileBasedWriteAheadLog(
            os.path.join(directory, f"blocks-{mode}"), fsync=True, direct_io=mode == "direct"
        )
        for mode in ("buffered", "direct")
    }
    cpu = dict.fromkeys(logs, 0.0)
    wall = dict.fromkeys(logs, 0.0)
    written = dict.fromkeys(logs, 0)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for mode, log in logs.items():
                c0, t0 = _cpu_s(), time.perf_counter()
                for _ in range(4):
                    log.write(payload, int(time.time() * 1000))
                cpu[mode] += _cpu_s() - c0
                wall[mode] += time.perf_counter() - t0
                written[mode] += 4 * BLOCK_BYTES
        direct_on = bool(logs["direct"]._storage.direct_io)  # type: ignore[attr-defined]
    finally:
        for log in logs.values():
            log.close()
    out: dict[str, Any] = {"direct_io_available": direct_on}
    for mode in logs:
        gb = written[mode] / 1e9
        out[mode] = {"cpu_s_per_gb": cpu[mode] / gb, "mb_s": written[mode] / wall[mode] / 1e6}
    return out


def bench_add_block(directory: str, threads: int, seconds: float) -> dict[str, float]:
    """Concurrent ``add_block`` calls on a batched, fsync'd driver WAL."""
    from spark_receivers.config import StreamingConfig
    from spark_receivers.driver.batches.received_block_tracker import (
        ReceivedBlockTracker,
        create_driver_wal,
    )
    from spark_receivers.rpc.messages import ReceivedBlockInfo

    wal = create_driver_wal(directory, StreamingConfig())
    tracker = ReceivedBlockTracker(range(threads), wal)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop = threading.Event()

    def run(stream: int) -> None:
        seq = 0
        handle = {"path": "x", "offset": 0, "length": 1}
        while not stop.is_set():
            info = ReceivedBlockInfo(
                stream, f"input-{stream}-1-{seq}", 1000, seq, "127.0.0.1:1", 100_000, handle
            )
            t0 = time.perf_counter()
            if not tracker.add_block(info):
                raise RuntimeError("add_block failed")
            latencies[stream].append(time.perf_counter() - t0)
            seq += 1

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    tracker.stop()
    flat = sorted(x for xs in latencies for x in xs)
    return {
        "threads": threads,
        "blocks": len(flat),
        "rate": len(flat) / elapsed,
        "p50_ms": 1000 * flat[len(flat) // 2],
        "p99_ms": 1000 * flat[int(len(flat) * 0.99)],
    }


def bench_recovery(directory: str, blocks: int, rows: int) -> dict[str, float]:
    """Write ``blocks`` Arrow blocks to a receiver WAL, then read them all back by handle."""
    import pyarrow as pa

    from spark_receivers.wal import CheckpointLayout, FileBasedWriteAheadLog
    from spark_receivers.wal.block_records import encode_block, read_block_from_wal

    table = pa.table({"value": [f"{i:010d} " + "x" * 89 for i in range(rows)]})
    data = encode_block(table)
    layout = CheckpointLayout(directory)
    log = FileBasedWriteAheadLog(
        layout.receiver_wal_dir(0), filesystem=layout.filesystem, fsync=False
    )
    handles = [log.write(data, 1_000 + i).to_dict() for i in range(blocks)]
    log.close()
    os.sync()
    t0 = time.perf_counter()
    records = sum(read_block_from_wal(layout, 0, h).num_rows for h in handles)
    elapsed = time.perf_counter() - t0
    return {"blocks": blocks, "records": records, "rate": records / elapsed, "seconds": elapsed}


def arrow_bytes_per_row() -> float:
    """Bytes a row of the pipeline's Arrow blocks takes in a receiver WAL record."""
    import pyarrow as pa

    from bench.store_pipeline import _records
    from spark_receivers.wal.block_records import encode_block

    table = pa.table({"value": pa.array(_records(10_000), pa.string())})
    return len(encode_block(table)) / table.num_rows


def bench_pipeline(seconds: float) -> list[dict[str, Any]]:
    """``bench.store_pipeline --forms one,arrow --wal abba`` in a child (its own JVM)."""
    from bench.store_pipeline import RESULT

    cmd = [sys.executable, "-m", "bench.store_pipeline", "--forms", "one,arrow", "--wal", "abba"]
    cmd += ["--seconds", str(seconds), "--warmup-seconds", str(min(10.0, seconds / 3))]
    done = subprocess.run(
        cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=10 * seconds + 300, check=False
    )
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            results: list[dict[str, Any]] = json.loads(line[len(RESULT) :])
            return results
    raise RuntimeError(f"store pipeline child failed: {(done.stderr or done.stdout)[-2000:]}")


def verdicts(results: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(measure, measured, target, met) rows from the results of :func:`run`."""
    rows = []
    for w in results["write"]:
        rows.append(
            (
                f"WAL write MB/s / raw fsync MB/s, {w['size'] // 1024} KiB records",
                f"{w['ratio']:.2f} ({w['wal_mb_s']:.1f} / {w['raw_mb_s']:.1f} MB/s)",
                f">= {TARGETS['write_ratio']}",
                w["ratio"] >= TARGETS["write_ratio"],
            )
        )
    b = results.get("block_write")
    if b:
        buffered, direct = b["buffered"], b["direct"]
        rows.append(
            (
                "receiver WAL block writes (8 MiB, fsync): CPU-s per GB direct / buffered"
                + ("" if b["direct_io_available"] else " (no O_DIRECT here: both buffered)"),
                f"{direct['cpu_s_per_gb']:.3f} / {buffered['cpu_s_per_gb']:.3f} "
                f"({direct['mb_s']:,.0f} / {buffered['mb_s']:,.0f} MB/s)",
                "direct <= buffered",
                direct["cpu_s_per_gb"] <= buffered["cpu_s_per_gb"],
            )
        )
    a = results["add_block"]
    rows.append(
        (
            f"driver block tracker add_block/s, batched WAL, {a['threads']} threads, "
            "in-process (no RPC: the endpoint is measured in the tracker section)",
            f"{a['rate']:,.0f}/s (p50 {a['p50_ms']:.2f} ms, p99 {a['p99_ms']:.2f} ms)",
            f">= {TARGETS['add_block_rate']:,}/s",
            a["rate"] >= TARGETS["add_block_rate"],
        )
    )
    r = results["recovery"]
    rows.append(
        (
            "recovery read rate (receiver WAL, by handle, to Arrow)",
            f"{r['rate']:,.0f} records/s ({r['records']:,} records)",
            f">= {TARGETS['recovery_rate']:,}/s",
            r["rate"] >= TARGETS["recovery_rate"],
        )
    )
    row_bytes = results.get("row_bytes", 104.0)
    for form in ("one", "arrow"):
        pipe = {
            wal: [p["rate"] for p in results.get("pipeline", []) if p["form"] == form
                  and p["wal"] is wal]
            for wal in (False, True)
        }  # fmt: skip
        if not pipe[True] or not pipe[False] or not sum(pipe[False]):
            continue
        on, off = (statistics.mean(pipe[wal]) for wal in (True, False))
        ratio = on / off
        on_mb_s = on * row_bytes / 1e6
        rows.append(
            (
                f"receiver throughput, WAL on / off, store({form}), whole pipeline",
                f"{ratio:.2f} ({on:,.0f} / {off:,.0f} rows/s; {on_mb_s:,.0f} MB/s of WAL)",
                f">= {TARGETS['wal_ratio']}",
                ratio >= TARGETS["wal_ratio"],
            )
        )
        big = [w for w in results["write"] if w["size"] >= 32 << 20]
        if form == "arrow" and big:
            disk = big[-1]["raw_mb_s"]
            rows.append(
                (
                    "store(arrow) with the WAL on: WAL MB/s / raw fsync MB/s, "
                    f"{big[-1]['size'] >> 20} MiB writes (the disk's bound)",
                    f"{on_mb_s / disk:.2f} ({on_mb_s:,.0f} / {disk:,.0f} MB/s)",
                    f">= {TARGETS['write_ratio']}",
                    on_mb_s / disk >= TARGETS["write_ratio"],
                )
            )
    return rows


def render_table(rows: list[tuple[str, str, str, bool]]) -> str:
    lines = ["| measure | measured | target | met |", "|---|---:|---:|:---:|"]
    lines += [f"| {a} | {b} | {c} | {'yes' if ok else 'NO'} |" for a, b, c, ok in rows]
    return "\n".join(lines)


def run(quick: bool, pipeline_seconds: float) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="wal-bench-", dir=os.environ.get("WAL_BENCH_DIR"))
    try:
        write_s = 1.0 if quick else 5.0
        results: dict[str, Any] = {
            "directory": directory,
            "write": [
                bench_write(directory, size, write_s) for size in (64 << 10, 1 << 20, 64 << 20)
            ],
            "block_write": bench_block_write(directory, 2.0 if quick else 10.0),
            "add_block": bench_add_block(
                os.path.join(directory, "driver"), 16, 2.0 if quick else 10.0
            ),
            "recovery": bench_recovery(directory, 20 if quick else 100, 10_000),
            "row_bytes": arrow_bytes_per_row(),
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if pipeline_seconds > 0:
        results["pipeline"] = bench_pipeline(pipeline_seconds)
    return results


NOTES = (
    "WAL and raw writes alternate in rounds of 8 records (one of 64 MiB) in one directory of "
    "the same disk; both fsync every record. AddBlock: 16 threads, one stream each, on the "
    "default batched driver WAL. Recovery: {blocks} blocks of 10,000 100-byte records read "
    "back by handle (the WAL-backed read path). The pipeline runs share one JVM: a warm-up "
    "context, then per form WAL off, on, on, off, backpressure finding the sustained rate; "
    "rows/s over the second half of each run, the mean of the two runs per mode; WAL MB/s is "
    "rows/s times the bytes a row takes in a WAL record."
)


def render(data: dict[str, Any]) -> str:
    """The ``wal`` section's body from a run's raw data."""
    blocks = data.get("recovery", {}).get("blocks", "the")
    return render_table(verdicts(data)) + "\n\n" + NOTES.format(blocks=blocks)


SECTION = Section(
    name="wal", module="bench.wal_bench", title="Write-ahead logs (issue 4)", render=render
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.wal_bench", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="short runs (smoke)")
    p.add_argument(
        "--pipeline-seconds", type=float, help="per run on local Spark (0: skip; 20, quick 8)"
    )
    add_record_arguments(p)
    args = p.parse_args(argv)
    seconds = (
        args.pipeline_seconds if args.pipeline_seconds is not None else (8 if args.quick else 20)
    )
    with Recording(SECTION, "python -m bench.wal_bench", argv, args) as rec:
        results = run(args.quick, seconds)
    print(render_table(verdicts(results)), flush=True)
    rec.finish(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
