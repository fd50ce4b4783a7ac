"""One receiver-WAL block write, step by step: thread CPU per 100-byte line.

A block of 80,000 lines of 100 bytes (an 8.24 MB Arrow IPC payload), written as the
receiver's WAL handler writes it: ``encode_block``, then ``FileBasedWriteAheadLog.write``
with direct I/O and ``fdatasync``, into a directory under /tmp. Each step 40 times after one
warm-up call; ``getrusage(RUSAGE_THREAD)`` user and system time, and wall time.
Run: ``.venv/bin/python bench/results/ab-20261202-wal-crc/wal_write_probe.py``.
"""

import resource
import tempfile
import time
import zlib

import pyarrow as pa
from zlib_ng import zlib_ng

from spark_receivers.receiver.lines import split_lines
from spark_receivers.wal._storage import _AlignedFrames
from spark_receivers.wal.block_records import encode_block
from spark_receivers.wal.file_log import FileBasedWriteAheadLog
from spark_receivers.wal.framing import encode_header

LINES = 80_000
table = pa.table({"value": split_lines(b"\n".join([b"x" * 99] * LINES), 1 << 20, False)})
payload = encode_block(table)


def measure(name, fn, reps=40):
    fn()
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    per = 1e9 / (reps * LINES)
    user = (r1.ru_utime - r0.ru_utime) * per
    system = (r1.ru_stime - r0.ru_stime) * per
    wall = (time.perf_counter() - t0) * per
    print(f"{name:42s} user {user:5.1f}  sys {system:5.1f}  wall {wall:6.1f} ns a line")


def now_ms():
    return int(time.time() * 1000)


print(f"payload {len(payload):,} bytes, {LINES:,} lines")
wal = FileBasedWriteAheadLog(tempfile.mkdtemp(), fsync=True, direct_io=True)
measure("encode_block", lambda: encode_block(table))
measure("zlib.crc32 (standard library)", lambda: zlib.crc32(payload))
measure("zlib_ng.crc32", lambda: zlib_ng.crc32(payload))
measure("encode_header (what the WAL uses)", lambda: encode_header(payload))
frames = _AlignedFrames()
header, flat = encode_header(payload), payload.cast("B")
measure("copy into the aligned frame", lambda: frames.frame(header, flat))
measure("FileBasedWriteAheadLog.write", lambda: wal.write(payload, now_ms()))
measure("encode_block + write", lambda: wal.write(encode_block(table), now_ms()))
wal.close()
