"""write_spool_file with write buffers of 1 MiB, 256 KiB and 64 KiB: CPU a row, alternated.

Run from the repository's root: python bench/results/probes-20261201/spool_buf.py
"""

import os
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, ".")
from spark_receivers.receiver import block_placement


def table(batches: int, rows: int) -> pa.Table:
    values = pa.array([("x" * 99) + str(i % 10) for i in range(rows)], pa.string())
    batch = pa.record_batch([values], names=["value"])
    return pa.Table.from_batches([batch] * batches)


def main() -> None:
    shapes = {
        "store bench (64 x 10,000 rows)": table(64, 10_000),
        "socket reader at 600,000 lines/s (4 x 30,000)": table(4, 30_000),
        "socket reader at 150,000 lines/s (4 x 7,500)": table(4, 7_500),
    }
    spool = tempfile.mkdtemp(dir="/tmp")
    for rnd in range(3):
        for label, t in shapes.items():
            row = []
            for size in (1 << 20, 256 << 10, 64 << 10):
                block_placement._SPOOL_WRITE_BUFFER = size
                reps = max(3, 200_000_000 // t.nbytes)
                t0 = time.process_time()
                for _ in range(reps):
                    path = block_placement.write_spool_file(spool, f"input-0-{rnd}-{size}", t)
                    os.unlink(path)
                ns = (time.process_time() - t0) / reps / t.num_rows * 1e9
                row.append(f"{size >> 10} KiB {ns:.1f}")
            print(f"{label}: ns of CPU a row: " + " | ".join(row), flush=True)
    os.rmdir(spool)


if __name__ == "__main__":
    main()
