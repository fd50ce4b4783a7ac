"""CPU of writing a block of 60,000 100-byte lines (25 chunks): Arrow IPC against Parquet forms.

Run from the repository's root: .venv/bin/python
bench/results/probes-20261202/parquet_write_probe.py

The Parquet spool (decision 0026) writes plain Parquet (no compression, dictionary or
statistics); this asks whether another form of Parquet writes for less: larger pages,
version 2 data pages, DELTA_LENGTH_BYTE_ARRAY, a required (non-null) column. To a file
through a 1 MiB buffered stream (as the spool does, without its preallocation), and to
memory. Process CPU per line; best and median of three rounds of 40 writes.
"""

import random
import string
import time

import pyarrow as pa
import pyarrow.parquet as pq

PATH = "/tmp/parquet_write_probe.out"
rnd = random.Random(1)
chunks = [
    pa.array(["".join(rnd.choices(string.ascii_lowercase + " ", k=99)) for _ in range(2400)])
    for _ in range(25)
]
table = pa.table({"value": pa.chunked_array(chunks)})
required = table.cast(pa.schema([pa.field("value", pa.string(), nullable=False)]))
PLAIN = {"compression": "none", "use_dictionary": False, "write_statistics": False}


def to_file(write):
    def run():
        with pa.OSFile(PATH, "wb") as raw, pa.BufferedOutputStream(raw, 1 << 20) as sink:
            write(sink)

    return run


def ipc(sink, t=table):
    with pa.ipc.new_file(sink, t.schema) as writer:
        writer.write_table(t)


def parquet(t=table, **options):
    return lambda sink: pq.write_table(t, sink, **PLAIN, **options)


forms = {
    "file: Arrow IPC": to_file(ipc),
    "file: Parquet plain (the spool's)": to_file(parquet()),
    "file: Parquet plain, 8 MiB pages": to_file(parquet(data_page_size=8 << 20)),
    "file: Parquet plain, v2 pages": to_file(parquet(data_page_version="2.0")),
    "file: Parquet DELTA_LENGTH_BYTE_ARRAY": to_file(
        parquet(column_encoding={"value": "DELTA_LENGTH_BYTE_ARRAY"})
    ),
    "file: Parquet plain, required": to_file(parquet(required)),
    "file: Parquet plain, required, v2": to_file(parquet(required, data_page_version="2.0")),
    "memory: Arrow IPC": lambda: ipc(pa.BufferOutputStream()),
    "memory: Parquet plain": lambda: parquet()(pa.BufferOutputStream()),
}
for name, run in forms.items():
    run()
    rounds = []
    for _ in range(3):
        start = time.process_time()
        for _ in range(40):
            run()
        rounds.append((time.process_time() - start) / 40 / table.num_rows * 1e9)
    best, median = min(rounds), sorted(rounds)[1]
    print(f"{name:40s} best {best:6.1f}, median {median:6.1f} ns of CPU a line", flush=True)
