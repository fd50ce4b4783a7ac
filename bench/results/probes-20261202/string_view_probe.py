"""Lines as Arrow ``string_view`` over the received bytes (no copy) against ``split_lines``.

Run from the repository's root: .venv/bin/python bench/results/probes-20261202/string_view_probe.py

PySpark 4.3's ``mapInArrow`` takes ``string_view`` batches for a ``string`` column (tried by
hand: a collect and a word count gave the lines back), so a receiver could keep the bytes it
read and build only views (length, 4-byte prefix, offset) with numpy, instead of copying every
line. This times that build (newline search, views; lines of 12 bytes or less, which a view
holds inline, are left out) against today's split, CPU per line on a 4 MB chunk of
40,000 100-byte lines, both checking UTF-8 over the whole chunk.

The views' numpy temporaries are 4 MB each: glibc hands such blocks back to the kernel when
freed, so each call may fault in fresh zeroed pages, or not, depending on what the heap
held. The log has two runs: glibc as it comes, and with
``MALLOC_MMAP_THRESHOLD_=134217728 MALLOC_TRIM_THRESHOLD_=268435456`` (freed memory kept).
"""

import sys
import time

sys.path.insert(0, ".")
import numpy as np
import pyarrow as pa

from spark_receivers.receiver.lines import _one_value, split_lines

LINES = [(f"{i:010d} " + "word " * 18)[:99].encode() for i in range(40000)]
CHUNK = b"\n".join(LINES)  # ~4 MB, without the last newline


def views(chunk: bytes) -> pa.Array:
    """The chunk's lines as ``string_view`` over the chunk's own bytes (lines > 12 bytes)."""
    raw = pa.py_buffer(chunk)
    arr = np.frombuffer(chunk, np.uint8)
    _one_value(chunk).cast(pa.string())  # UTF-8, checked as split_lines checks it
    newlines = np.flatnonzero(arr == 10)
    starts = np.empty(len(newlines) + 1, np.int64)
    starts[0], starts[1:] = 0, newlines + 1
    ends = np.empty(len(newlines) + 1, np.int64)
    ends[:-1], ends[-1] = newlines, len(chunk)
    view = np.zeros((len(starts), 4), np.int32)  # length, prefix, buffer index, offset
    view[:, 0] = (ends - starts).astype(np.int32)  # cast first: a strided cast is slow
    padded = np.concatenate([arr, np.zeros(16, np.uint8)])
    unaligned = np.ndarray(shape=(len(arr),), dtype="<i4", buffer=padded, strides=(1,))
    view[:, 1] = unaligned[starts]  # the first 4 bytes of each line
    view[:, 3] = starts.astype(np.int32)
    return pa.Array.from_buffers(pa.string_view(), len(starts), [None, pa.py_buffer(view), raw])


def split() -> pa.Array | None:
    return split_lines(CHUNK, 1 << 20, False)


assert views(CHUNK).cast(pa.string()).equals(split()), "the two splits differ"
for round_ in range(3):
    for name, step in (("split_lines", split), ("views", lambda: views(CHUNK))):
        t = time.process_time()
        for _ in range(50):
            step()
        t = time.process_time() - t
        print(f"round {round_} {name}: {t / 50 / len(LINES) * 1e9:.1f} ns a line", flush=True)
