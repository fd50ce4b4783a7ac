"""CPU of one block's way into this executor's keeper, whatever its size, by part.

Run from the repository's root: .venv/bin/python bench/results/probes-20261202/block_cost_probe.py

A keeper process is started as a receiver starts it (``ensure_local_keeper``, spool on,
watching this process); blocks of 1,000 short lines (small, so the fixed costs show) go in:

* ``sink.put``: ``KeeperSink.put`` as the block writer calls it (spool file + ``AdoptBlock``),
  then ``KeeperSink.remove`` (a ``RemoveBlocks``), so that the keeper holds no more blocks;
* ``spool write``: ``write_spool_file`` alone (the file, no call);
* ``adopt call``: the ``AdoptBlock`` call alone, on files written before the clock starts
  (all removed by one call at the end);
* ``remove call``: a ``RemoveBlocks`` of one block (what the driver sends after a batch);
* ``describe call``: a ``DescribeKeeper`` (the cheapest authenticated action: the RPC's floor).

CPU of this process (``time.process_time``: the calling thread and gRPC's threads) and of
the keeper process (``/proc``), per block; 300 of each first, then three alternated
rounds of 500.
"""

import dataclasses
import os
import secrets
import sys
import time

sys.path.insert(0, ".")
import pyarrow as pa

from bench.proc_cpu import tree_cpu_seconds
from spark_receivers.config import StreamingConfig
from spark_receivers.receiver.block_placement import KeeperSink, keeper_settings, write_spool_file
from spark_receivers.receiver.keeper_process import ensure_local_keeper
from spark_receivers.receiver.storage_level import StorageLevel
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient


class Tracker:
    """The driver's side of the sink's calls, answered here: only ``RegisterBlockKeeper``."""

    def call(self, message: object, timeout_s: float | None = None) -> object:
        return True


secret = secrets.token_hex(16)
config = StreamingConfig()
settings = keeper_settings(secret, "127.0.0.1", config)
settings = dataclasses.replace(settings, spool=True)
handle = ensure_local_keeper(settings, watch_pid=os.getpid())
print(f"keeper pid {handle.pid} at {handle.address}, spool {handle.spool_dir}", flush=True)
sink = KeeperSink(
    0,
    "driver",
    "127.0.0.1",
    StorageLevel.MEMORY_AND_DISK,
    lambda restart: handle,
    Tracker(),
    lambda address: EndpointClient(address, secret),
    30.0,
)
sink.start()
client = EndpointClient(handle.address, secret)
table = pa.table({"value": pa.array([f"line {i:05d} " + "x" * 80 for i in range(1000)])})
counter = iter(range(10**9))


def block_id() -> str:
    return f"input-0-1-{next(counter)}"


def put() -> None:
    name = block_id()
    sink.put(name, table, 1000)
    sink.remove(name, [handle.address])


def spool_write() -> None:
    os.unlink(write_spool_file(handle.spool_dir, block_id(), table))


def describe() -> None:
    client.call(m.DescribeKeeper())


def remove() -> None:
    client.call(m.RemoveBlocks((block_id(),)))


def timed(name: str, step, n: int, prepare=None) -> None:
    args = [prepare() for _ in range(n)] if prepare else [() for _ in range(n)]
    own, keeper, wall = time.process_time(), tree_cpu_seconds(handle.pid), time.perf_counter()
    for a in args:
        step(*a)
    own = time.process_time() - own
    keeper = tree_cpu_seconds(handle.pid) - keeper
    wall = time.perf_counter() - wall
    per = {"this process": own, "keeper": keeper, "sum": own + keeper, "wall": wall}
    shown = ", ".join(f"{k} {v / n * 1e3:6.3f} ms" for k, v in per.items())
    print(f"{name:15s} n={n}: {shown} a block", flush=True)


def prepared_adopt() -> tuple:
    name = block_id()
    path = write_spool_file(handle.spool_dir, name, table)
    return (name, path)


def adopt(name: str, path) -> None:
    client.call(m.AdoptBlock(name, 1000, True, path.name))


forms = {
    "sink.put": (put, None),
    "spool write": (spool_write, None),
    "adopt call": (adopt, prepared_adopt),
    "remove call": (remove, None),
    "describe call": (describe, None),
}
for name, (step, prepare) in forms.items():
    timed(f"{name} (warm)", step, 300, prepare)
for round_ in range(3):
    print(f"round {round_ + 1}", flush=True)
    for name, (step, prepare) in forms.items():
        timed(name, step, 500, prepare)
client.call(m.RemoveBlocks(tuple(f"input-0-1-{i}" for i in range(next(counter)))))
client.call(m.ReleaseKeeper())
os.kill(handle.pid, 15)
