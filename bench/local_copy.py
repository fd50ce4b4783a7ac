"""What the local copy of a block costs: the keeper's Flight put and get vs a shared IPC file.

    python -m bench.local_copy                    # ~1 minute
    python -m bench.local_copy --lines 30000,135000 --blocks 40

Issue 31, item 4. A receiver's block goes to the block keeper of its executor with an Arrow
Flight ``do_put`` (the client serializes the table into gRPC messages, the keeper reads them
back into a table and keeps it), and a batch's read task gets it back with ``do_get``. The
other design: write the block once as an Arrow IPC file in shared memory (``/dev/shm``) that
the keeper adopts and the read task maps (no copy on either read). Measured here, per block
of ``--lines`` of the ladder's 100-byte lines (30,000 is a 200 ms block at 150,000 lines/s;
135,000 at 675,000), in CPU-seconds of both sides (this process's own, from
``time.process_time``; the keeper's, from ``/proc``):

- ``flight put``: ``EndpointClient.put_table`` to a real keeper process (the receiver's side
  + the keeper's);
- ``flight get``: ``EndpointClient.read_table`` of the same block (the read task's side + the
  keeper's);
- ``shm write``: the block written once as an IPC file under ``/dev/shm`` (the receiver's
  side; the keeper's side would be one small control call, not measured);
- ``shm map``: the file mapped and read as a table (``pa.memory_map``, no copy; the last
  page of each buffer touched, so the mapping is real).

Printed as microseconds per block and core-seconds per million lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import stat_cpu_seconds

__all__ = ["main", "measure"]


def _lines(n: int) -> Any:
    from bench.query_floor import lines_table
    from spark_receivers.receivers.lines import BLOCK_LINES, LinePool

    table = lines_table(LinePool(), -(-n // BLOCK_LINES) * BLOCK_LINES)
    return table.slice(0, n)


def _keeper(secret: str) -> Any:
    from spark_receivers.config import StreamingConfig
    from spark_receivers.receiver.block_placement import keeper_settings
    from spark_receivers.receiver.keeper_process import ensure_local_keeper

    settings = keeper_settings(secret, "127.0.0.1", StreamingConfig())
    return ensure_local_keeper(settings, watch_pid=os.getpid())


def measure(lines: int, blocks: int, shm_dir: str) -> dict[str, float]:
    """Microseconds of CPU per block for each way (see the module doc)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.auth import new_secret
    from spark_receivers.rpc.transport import EndpointClient

    table = _lines(lines)
    secret = new_secret()
    keeper = _keeper(secret)
    client = EndpointClient(keeper.address, secret)
    keeper_stat = f"/proc/{keeper.pid}/stat"
    out: dict[str, float] = {}
    try:
        names = [f"input-0-1-{i}" for i in range(blocks)]
        for i, name in enumerate(names[:3]):  # warm: connections, imports
            client.put_table(json.dumps({"block": name, "generated_ms": i}).encode(), table)
            client.read_table(name.encode())
        client.call(m.RemoveBlocks(tuple(names[:3])))

        def timed(step: Any) -> tuple[float, float]:
            k0, p0 = stat_cpu_seconds(keeper_stat), time.process_time()
            for i, name in enumerate(names):
                step(i, name)
            return time.process_time() - p0, stat_cpu_seconds(keeper_stat) - k0

        mine, theirs = timed(
            lambda i, name: client.put_table(
                json.dumps({"block": name, "generated_ms": i}).encode(), table
            )
        )
        out["flight put: receiver"] = mine / blocks * 1e6
        out["flight put: keeper"] = theirs / blocks * 1e6
        mine, theirs = timed(lambda _i, name: client.read_table(name.encode()))
        out["flight get: read task"] = mine / blocks * 1e6
        out["flight get: keeper"] = theirs / blocks * 1e6
        client.call(m.RemoveBlocks(tuple(names)))

        def write(_i: int, name: str) -> None:
            path = os.path.join(shm_dir, f"{name}.arrow")
            with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)

        def read(_i: int, name: str) -> None:
            with pa.memory_map(os.path.join(shm_dir, f"{name}.arrow")) as source:
                got = ipc.open_file(source).read_all()
                for column in got.columns:
                    for chunk in column.chunks:
                        for buf in chunk.buffers():
                            if buf is not None and buf.size:
                                _ = memoryview(buf)[buf.size - 1]  # map its last page in

        out["shm write: receiver"] = timed(write)[0] / blocks * 1e6
        out["shm map: read task"] = timed(read)[0] / blocks * 1e6
        for name in names:
            os.remove(os.path.join(shm_dir, f"{name}.arrow"))
    finally:
        client.call(m.ReleaseKeeper())
        client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.local_copy", description=__doc__)
    p.add_argument("--lines", default="30000,135000", help="lines per block, comma-separated")
    p.add_argument("--blocks", type=int, default=40)
    args = p.parse_args(argv)
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="local-copy-", dir=shm) as shm_dir:
        for n in (int(x) for x in args.lines.split(",") if x):
            result = measure(n, args.blocks, shm_dir)
            print(f"\nblocks of {n:,} lines ({n * 100 / 1e6:.1f} MB), {args.blocks} blocks:")
            for k, us in result.items():
                print(f"  {k:24} {us:10,.0f} µs per block  {us / n:8.3f} core-s per million lines")
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
