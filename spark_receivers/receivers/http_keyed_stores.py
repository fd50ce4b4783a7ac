"""The stores of :class:`~spark_receivers.receivers.http.HttpReceiver`'s keyed requests, grouped.

A request with an ``Idempotency-Key`` is stored with the window's keys as its block's
source position (:meth:`IdempotencyKeys.position_with`), and the newest block the driver
accepted must hold every key stored before it: two keyed blocks stored at once would each
miss the other's key. So keyed stores never overlap; instead of waiting for each other
one by one they are **grouped** (a group commit): a request joins a queue, and one
thread at a time — the leader — takes every request queued, stores their records as one
block whose position names all their keys (and the newest others of the window, up to
``position_bytes``), remembers the keys, and wakes each request with the outcome. While
a group is being stored the next one gathers, so concurrent keyed clients share one
driver round trip. A group holds at most as many requests as run stores at once (each
waits on a thread of the receiver's store pool, ``max_concurrent_stores``).

A failed group fails every request in it (each answered 503 and retried by its client);
none of their keys is remembered.

Thread contract: :meth:`KeyedStores.store` blocks its caller until its request's group
was stored or failed; any number of threads may call it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from spark_receivers.errors import ReceiverError
from spark_receivers.receivers.http_idempotency import IdempotencyKeys

__all__ = ["KeyedStores"]

StoreGroup = Callable[[Any, "int | list[int]", str], None]
"""``store(records, times_us, position)``: one reliable store of a group's records."""


@dataclass(eq=False)
class _Request:
    key: str
    records: list[Any] | pa.Array | pa.Table
    arrived_us: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class KeyedStores:
    """Keyed requests' stores, one group at a time (see the module doc)."""

    def __init__(self, keys: IdempotencyKeys, store: StoreGroup, position_bytes: int) -> None:
        self._keys = keys
        self._store = store
        self._position_bytes = position_bytes
        self._leader = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: list[_Request] = []
        self.groups = 0
        """Groups stored (each one block)."""

    @property
    def queued(self) -> int:
        """Requests waiting for the next group."""
        with self._queue_lock:
            return len(self._queue)

    def store(self, key: str, records: list[Any] | pa.Array | pa.Table, arrived_us: int) -> None:
        """Store ``records`` of the request with ``key`` reliably, then remember the key.

        Blocks until its group was stored; raises :class:`ReceiverError` when it failed.
        """
        request = _Request(key, records, arrived_us)
        with self._queue_lock:
            self._queue.append(request)
        with self._leader:
            # A leader before this one took it, and set done before it let go of the lock.
            if not request.done.is_set():
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self._store_group(group)
        if request.error is not None:
            msg = f"the store of {len(records)} records failed: {request.error}"
            raise ReceiverError(msg) from request.error

    def _store_group(self, group: list[_Request]) -> None:
        """Store ``group`` as one block; every request's outcome set, every one woken."""
        try:
            new = [(r.key, len(r.records)) for r in group]
            position = self._keys.position_with(new, self._position_bytes)
            records, times = _combined(group)
            self._store(records, times, position)
            for key, n in new:  # before the next group takes its position
                self._keys.finish(key, {"stored": n})
            self.groups += 1
        except Exception as e:  # noqa: BLE001 - each request raises it in its own thread
            for r in group:
                r.error = e
        finally:
            for r in group:
                r.done.set()


def _combined(
    group: list[_Request],
) -> tuple[list[Any] | pa.Array | pa.Table, int | list[int] | pa.Array]:
    """The group's records as one list, Arrow array or table, and their arrival times.

    Arrow records (``lines``, or ``json`` under a declared schema) stay Arrow, their
    times one Arrow array: nothing per record in Python.
    """
    if len(group) == 1:
        return group[0].records, group[0].arrived_us
    if all(isinstance(r.records, pa.Array | pa.Table) for r in group):
        times = pa.concat_arrays(
            [pa.repeat(pa.scalar(r.arrived_us, pa.int64()), len(r.records)) for r in group]
        )
        if all(isinstance(r.records, pa.Array) for r in group):
            return pa.concat_arrays([r.records for r in group]), times
        if all(isinstance(r.records, pa.Table) for r in group):
            return pa.concat_tables([r.records for r in group]), times
    records: list[Any] = []
    for r in group:
        if isinstance(r.records, pa.Table | pa.Array):  # beside a line-by-line body's records
            records.extend(r.records.to_pylist())  # a table's rows: dicts, as that path's
        else:
            records.extend(r.records)
    return records, [r.arrived_us for r in group for _ in range(len(r.records))]
