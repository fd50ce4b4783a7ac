"""Probe: how long a block's spool write and its AdoptBlock take in the store benchmark.

Runs the store benchmark's Arrow form for 5 s (``bench.store_bench.run_form``) with
``write_spool_file`` and ``EndpointClient.call`` (AdoptBlock only) timed in the receiver's
process; prints count, p50, p90 and mean of each. With ``PYTHONPATH=<this directory>`` the
``sitecustomize.py`` beside it also times ``BlockKeeper.adopt``, ``BlockStore.put``,
``map_spool_file`` and ``BlockKeeper.remove`` inside the keeper's process (wall and thread
CPU, one line each into /tmp/probe/keeper-times-<pid>.log). Decision 0011, 2026-11-30.

Run from the repository's root, with ``D=bench/results/ab-20261130-spool-write``:
``PYTHONPATH=$D python $D/adopt_times.py``
"""

from __future__ import annotations

import os
import secrets
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
from bench import store_bench
from spark_receivers.receiver import block_placement
from spark_receivers.rpc.transport import EndpointClient

WRITES: list[float] = []
ADOPTS: list[float] = []


def _timed_write(*args, **kwargs):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    try:
        return _write(*args, **kwargs)
    finally:
        WRITES.append(time.perf_counter() - t0)


def _timed_call(self, message, *args, **kwargs):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    try:
        return _call(self, message, *args, **kwargs)
    finally:
        if type(message).__name__ == "AdoptBlock":
            ADOPTS.append(time.perf_counter() - t0)


_write, _call = block_placement.write_spool_file, EndpointClient.call
block_placement.write_spool_file = _timed_write
EndpointClient.call = _timed_call


def main() -> None:
    os.makedirs("/tmp/probe", exist_ok=True)
    secret = secrets.token_hex(16)
    with store_bench.StoreDriver(secret) as driver:
        result = store_bench.run_form("arrow", 5, driver, secret)
    print(f"arrow {result.rate:,.0f} records/s to the store")
    for name, times in (("write", WRITES), ("adopt", ADOPTS)):
        times.sort()
        print(
            f"{name} {len(times)} p50 {1e3 * times[len(times) // 2]:.1f} ms "
            f"p90 {1e3 * times[int(len(times) * 0.9)]:.1f} ms "
            f"mean {1e3 * statistics.mean(times):.1f}"
        )


if __name__ == "__main__":
    main()
