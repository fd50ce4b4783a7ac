"""The UTF-8 check of a chunk's lines: per line (a cast of the split lines) or of the chunk at once.

Run from the repository's root: python bench/results/probes-20261201/utf8_probe.py
CPU time per line (process_time) of split and check together, 40 splits of a 3 MiB chunk of
the line server's lines (the socket reader stores 50 ms of reads at once: ~3 MiB at 600,000
lines/s), the two ways alternated, three rounds. ``split_lines`` is the shipped function
(the check of the whole chunk since 2026-12-01); ``per line`` is the way before it.
"""

import sys
import time

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, ".")
from spark_receivers.receiver.lines import _one_value, split_lines
from spark_receivers.receivers.lines import LINE_BYTES, LinePool

CHUNK = 3 << 20
SPLITS = 40


def per_line(chunk: bytes) -> pa.Array:
    lines = pc.split_pattern(_one_value(chunk), b"\n").values
    return lines.cast(pa.string())


def shipped(chunk: bytes) -> pa.Array:
    text = split_lines(chunk, 1 << 20, has_cr=False)
    assert text is not None
    return text


def main() -> None:
    pool = LinePool()
    raw = bytes(pool.block(0)) + bytes(pool.block(1))
    chunk = raw[: CHUNK // LINE_BYTES * LINE_BYTES - 1]  # whole lines, the last newline cut
    assert per_line(chunk).equals(shipped(chunk))
    lines = chunk.count(b"\n") + 1
    for rnd in range(3):
        row = []
        for name, split in (("per line", per_line), ("split_lines", shipped)):
            t0 = time.process_time()
            for _ in range(SPLITS):
                split(chunk)
            row.append(f"{name} {(time.process_time() - t0) / SPLITS / lines * 1e9:.1f}")
        print(f"round {rnd + 1}: ns of CPU a line: " + " | ".join(row))


if __name__ == "__main__":
    main()
