"""A batch read by Spark's own file readers against ours (a ``mapInArrow`` over mapped files).

Run from the repository's root: python bench/results/probes-20261201/spark_file_read_probe.py

A question for a later design, not a change: what would the batch read cost if a block's
spool file were Parquet that the JVM reads itself (no Python read task, no Arrow stream
into the JVM, columns pruned), or the lines' own bytes read by Spark's text source
(``lineSep="\\n"``), instead of an Arrow IPC file that a Python task maps and sends
through ``mapInArrow`` (what ``spark/block_source.py`` does)? One Spark session with
the ladder's settings (``local[4]``); 600,000 of the line server's lines as five blocks
of 120,000 (one second at 600,000 lines/s, 200 ms blocks), written the three ways to
/tmp. Each run builds the batch's DataFrame anew (as each batch does) and runs the query on
it; the CPU of this process tree (``bench.proc_cpu``), per million lines, the three reads
alternated, after a warm-up of each. Then the CPU of writing a block each way (this
process, ``process_time``). The log's second part is of an earlier version with the first
two forms only. The tasks' row ranges are computed here, not by ``split_rows``: equal
shares of the rows, as ``split_rows`` gives them for blocks of equal size.
"""

import os
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, ".")
from bench import proc_cpu
from bench.child import local_session
from bench.pipelines import line_count, word_count
from bench.query_floor import lines_table
from spark_receivers.receiver.block_placement import write_spool_file
from spark_receivers.receivers.lines import LinePool

LINES = 600_000
BLOCKS = 5
TASKS = 4
WARM = 15
RUNS = 10
ROUNDS = 3


def write_parquet(directory: str, name: str, table: pa.Table) -> str:
    path = os.path.join(directory, name + ".parquet")
    pq.write_table(table, path, compression="none", use_dictionary=False, write_statistics=False)
    return path


def write_text(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name + ".txt")
    with open(path, "wb") as f:  # the lines' bytes with their newlines, as a socket gave them
        f.write(data)
    return path


def main() -> None:
    table = lines_table(LinePool(), LINES)
    size = LINES // BLOCKS
    blocks = [table.slice(i * size, size).combine_chunks() for i in range(BLOCKS)]
    spool = tempfile.mkdtemp(prefix="probe-spool-", dir="/tmp")
    arrow_files = [str(write_spool_file(spool, f"b{i}", b)) for i, b in enumerate(blocks)]
    parquet_files = [write_parquet(spool, f"b{i}", b) for i, b in enumerate(blocks)]
    texts = [("\n".join(b.column(0).to_pylist()) + "\n").encode() for b in blocks]
    text_files = [write_text(spool, f"b{i}", t) for i, t in enumerate(texts)]
    per_task = LINES // TASKS

    def read_runs(ids):  # the mapInArrow function: task i reads rows [i*per_task, ...)
        import pyarrow as pa

        for batch in ids:
            for index in batch.column(0).to_pylist():
                first, end = index * per_task, (index + 1) * per_task
                for k, path in enumerate(arrow_files):
                    lo, hi = max(first, k * size), min(end, (k + 1) * size)
                    if lo >= hi:
                        continue
                    with pa.memory_map(path) as source:
                        t = pa.ipc.open_file(source).read_all()
                    yield from t.slice(lo - k * size, hi - lo).to_batches()

    spark = local_session("parquet-read-probe")
    try:
        forms = {
            "mapInArrow over Arrow IPC files": lambda: spark.range(
                TASKS, numPartitions=TASKS
            ).mapInArrow(read_runs, "value string"),
            "Spark's Parquet reader": lambda: spark.read.schema("value string").parquet(
                *parquet_files
            ),
            "Spark's text reader": lambda: spark.read.option("lineSep", "\n").text(text_files),
        }
        for query_name, query in (("line count", line_count), ("word count", word_count)):
            for make in forms.values():
                assert query(make()) == LINES
                for _ in range(WARM):
                    query(make())
            for rnd in range(ROUNDS):
                row = []
                for name, make in forms.items():
                    with proc_cpu.TreeSampler(os.getpid()) as tree:
                        start = tree.mark()
                        t0 = time.monotonic()
                        for _ in range(RUNS):
                            query(make())
                        wall = (time.monotonic() - t0) / RUNS
                        end = tree.mark()
                        cpu = tree.window(start, end).total / RUNS
                    row.append(f"{name} {cpu / LINES * 1e6:.2f} core-s/M ({wall * 1000:.0f} ms)")
                print(f"{query_name}, round {rnd + 1}: " + " | ".join(row), flush=True)
    finally:
        spark.stop()
    for rnd in range(ROUNDS):
        row = []
        writes = (
            ("IPC file", lambda k, b: write_spool_file(spool, f"w{k}", b)),
            ("Parquet", lambda k, b: write_parquet(spool, f"w{k}", b)),
            ("the lines' bytes", lambda k, b: write_text(spool, f"w{k}", texts[k])),
        )
        for name, write in writes:
            t0 = time.process_time()
            for k, b in enumerate(blocks):
                os.unlink(write(k, b))
            row.append(f"{name} {(time.process_time() - t0) / LINES * 1e9:.1f}")
        print(f"write a block, round {rnd + 1}: ns of CPU a line: " + " | ".join(row), flush=True)
    for path in arrow_files + parquet_files + text_files:
        os.unlink(path)
    os.rmdir(spool)


if __name__ == "__main__":
    main()
