"""Lines of a chunk as an Arrow string array: Arrow's split kernel against numpy offsets.

Run from the repository's root: python bench/results/probes-20261201/split_probe.py
CPU time per line (process_time), three rounds, chunks of 256 KiB and 3 MiB of 100-byte-ish
lines (the socket reader stores 50 ms of reads at once: ~3 MiB at 600,000 lines/s).
"""

import random
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, ".")
from spark_receivers.receiver.lines import _one_value, split_lines


def make_chunk(n_bytes: int) -> bytes:
    rnd = random.Random(1)
    words = [f"w{i}" for i in range(1000)]
    lines, total = [], 0
    while total < n_bytes:
        line = " ".join(rnd.choice(words) for _ in range(30))[:99]
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines).encode()


def split_numpy(chunk, mode: str) -> pa.Array | None:
    """Newlines by numpy, one UTF-8 check of the whole chunk, the copy by replace or mask."""
    try:
        _one_value(chunk).cast(pa.string())
    except pa.ArrowInvalid:
        return None
    arr = np.frombuffer(chunk, np.uint8)
    newline = arr == 10
    at = np.flatnonzero(newline)
    k = len(at)
    data = bytes(chunk).replace(b"\n", b"") if mode == "replace" else arr[~newline]
    offsets = np.empty(k + 2, np.int32)
    offsets[0] = 0
    np.subtract(at, np.arange(k), out=offsets[1 : k + 1], casting="unsafe")
    offsets[k + 1] = len(arr) - k
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), k + 1, buffers)


def ns_per_line(f, lines: int, reps: int) -> float:
    f()
    t0 = time.process_time()
    for _ in range(reps):
        f()
    return (time.process_time() - t0) / reps / lines * 1e9


def main() -> None:
    for size in (256 << 10, 3 << 20):
        chunk = make_chunk(size)
        lines = chunk.count(b"\n") + 1
        view = memoryview(bytearray(chunk))
        expected = split_lines(view, 1 << 20)
        assert split_numpy(view, "replace").equals(expected)
        assert split_numpy(view, "mask").equals(expected)
        reps = max(5, (96 << 20) // size)

        def kernel_split(v=view):
            return split_lines(v, 1 << 20)

        def replace_split(v=view):
            return split_numpy(v, "replace")

        def mask_split(v=view):
            return split_numpy(v, "mask")

        for _ in range(3):
            kernel = ns_per_line(kernel_split, lines, reps)
            replace = ns_per_line(replace_split, lines, reps)
            mask = ns_per_line(mask_split, lines, reps)
            print(
                f"{size >> 10} KiB: Arrow split_pattern {kernel:.1f}, numpy + bytes.replace "
                f"{replace:.1f}, numpy + mask {mask:.1f} ns of CPU a line",
                flush=True,
            )


if __name__ == "__main__":
    main()
