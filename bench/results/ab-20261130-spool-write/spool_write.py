"""Probe: how a 64 MiB spool file is written (decision 0011, "The spool write...", 2026-11-30).

Three ways to write the same Arrow IPC file of 64 batches of 10,000 100-byte strings,
alternated round by round, 8 files a round, each file deleted after the round:

- ``truncate``: created with O_EXCL, then opened again by pyarrow with "wb" (truncation),
  as ``write_spool_file`` did before 3c296a1;
- ``append``: the same, opened with "ab" (3c296a1);
- ``reserve``: "ab" after ``fallocate(FALLOC_FL_KEEP_SIZE)`` of the table's size (b3e3b2b).

Run from the repository's root: ``python bench/results/ab-20261130-spool-write/spool_write.py
[DIR] [ROUNDS]`` (DIR: a directory on the file system to test, default a new one under
/tmp). Prints M rows/s (wall) and ns of CPU a row (this process) per round.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.getcwd())
from bench.store_bench import make_records

TABLE = pa.Table.from_batches(
    [
        pa.RecordBatch.from_arrays(
            [pa.array(make_records(10_000, offset=i * 10_000), pa.string())], names=["value"]
        )
        for i in range(64)
    ]
)
_fallocate = ctypes.CDLL(None, use_errno=True).fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def write(directory: str, mode: str) -> str:
    path = os.path.join(directory, secrets.token_hex(6) + ".arrow")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    if mode == "reserve":
        _fallocate(fd, 1, 0, TABLE.nbytes + 1024 * 65)
    os.close(fd)
    with (
        pa.OSFile(path, "wb" if mode == "truncate" else "ab") as raw,
        pa.BufferedOutputStream(raw, 1 << 20) as sink,
        pa.ipc.new_file(sink, TABLE.schema) as writer,
    ):
        writer.write_table(TABLE)
    return path


def main() -> None:
    directory = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="spool-probe-")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    results: dict[str, list[str]] = {}
    for _ in range(rounds):
        for mode in ("truncate", "append", "reserve"):
            paths = []
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(8):
                paths.append(write(directory, mode))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            for p in paths:
                os.unlink(p)
            rows = 8 * TABLE.num_rows
            results.setdefault(mode, []).append(
                f"{rows / wall / 1e6:.1f} M/s {cpu / rows * 1e9:.1f} ns"
            )
    for mode, figures in results.items():
        print(f"{mode:9s}", " | ".join(figures))


if __name__ == "__main__":
    main()
