"""An in-process stand-in for ReceiverSupervisor: runs one receiver without Spark.

It keeps what the receiver stores in memory, in order, with the contract of
the real supervisor: ``store(..., reliable=True)`` returns only once the
records are kept (and raises when ``fail_stores`` is set), restarts run
``on_stop``/``on_start`` on a thread of their own after the delay, ``stop``
is final. The Spark path is covered by tests/integration/test_builtin_receivers.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.job_identity import checkpoint_job_id
from spark_receivers.errors import ReceiverError
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.schema import (
    check_record,
    is_block_data,
    is_default,
    is_many,
    to_table,
)


class HarnessSupervisor:
    """Both the receiver's supervisor and its intake (what ``store`` reaches).

    ``checkpoint_dir`` and ``app_id`` play the job's identity (``durable_name``).

        As a context does at start, a ``checkpoint_dir`` gives the config the job id kept
        in it (written there the first time); ``job_id`` sets one instead.
    """

    # No fast path: every store goes through admit, then add_records, which the tests watch.
    add_text = None

    def __init__(
        self,
        receiver: Receiver,
        stream_id: int = 0,
        max_rate: float | None = None,
        *,
        checkpoint_dir: str = "",
        app_id: str = "",
        job_id: str | None = None,
    ):
        self.receiver = receiver
        if job_id is None and checkpoint_dir:
            job_id = checkpoint_job_id(checkpoint_dir)
        self.config = StreamingConfig(checkpoint_dir=checkpoint_dir, job_id=job_id or "")
        self.app_id = app_id
        self.rate_limiter = RateLimiter(max_rate)
        self.records: list[Any] = []
        self.reliable_batches: list[list[Any]] = []
        self.positions: list[str] = []
        self.tables_stored = 0
        """Stores that handed over an Arrow table or batch (no Python object per record)."""
        """Every ``store(..., position=...)``'s position, in order (the driver's view)."""
        self.errors: list[str] = []
        self.restarts: list[str] = []
        self.stopped_with: str | None = None
        self.fail_stores: BaseException | None = None
        self.store_delay_s = 0.0
        self.on_reliable_store = None  # called with the records before they are kept
        self._started = False
        self._stopped = False
        self._changed = threading.Condition()
        receiver._attach(self, stream_id, self)  # type: ignore[arg-type]

    # --- what Receiver calls --------------------------------------------------

    def admit(
        self, data: Any, metadata: Any = None, reliable: bool = False, position: Any = None
    ) -> None:
        """As the pipe's intake tells the forms apart: a block, many records, one."""
        if is_block_data(data):
            self.push_table(data, metadata, reliable, position)
        elif is_many(data, self.receiver.schema):
            self.add_records(list(data), metadata, reliable, position)
        else:
            self.add_records([data], metadata, reliable, position)

    def add_records(
        self, records: list[Any], metadata: Any, reliable: bool, position: Any = None
    ) -> None:
        if not is_default(self.receiver.schema) or not all(type(r) is str for r in records):
            for r in records:
                check_record(r, self.receiver.schema)
        self.rate_limiter.acquire(len(records))
        if reliable:
            if self.store_delay_s:
                time.sleep(self.store_delay_s)
            if self.fail_stores is not None:
                raise ReceiverError("store failed") from self.fail_stores
            if self.on_reliable_store is not None:
                self.on_reliable_store(records)
        with self._changed:
            if reliable:
                self.reliable_batches.append(list(records))
            self.records.extend(records)
            if position is not None:
                self.positions.append(position)
            self._changed.notify_all()

    def push_table(self, data: Any, metadata: Any, reliable: bool, position: Any = None) -> None:
        """A table of the default schema as its values, any other as one dict per row."""
        table = to_table(data, self.receiver.schema)
        self.tables_stored += 1
        if is_default(self.receiver.schema):
            self.add_records(table.column("value").to_pylist(), metadata, reliable, position)
        else:
            self.add_records(table.to_pylist(), metadata, reliable, position)

    def restart_receiver(self, message: str, error: Any, delay_ms: int | None) -> None:
        self.restarts.append(message)

        def run() -> None:
            self._stop_receiver()
            time.sleep((delay_ms if delay_ms is not None else 100) / 1000.0)
            if not self._stopped:
                self.start()

        threading.Thread(target=run, daemon=True, name="harness-restart").start()

    def stop(self, message: str, error: Any = None) -> None:
        self.stopped_with = message
        self._stopped = True
        self._stop_receiver()

    def report_error(self, message: str, error: Any) -> None:
        with self._changed:
            self.errors.append(message)
            self._changed.notify_all()

    def accepted_position(self) -> str | None:
        """The position of the last store with one, as the driver would answer."""
        with self._changed:
            return self.positions[-1] if self.positions else None

    def is_receiver_started(self) -> bool:
        return self._started

    def is_receiver_stopped(self) -> bool:
        return not self._started

    # --- what tests call --------------------------------------------------------

    def start(self) -> HarnessSupervisor:
        self._started = True
        self.receiver.on_start()
        return self

    def _stop_receiver(self) -> None:
        if self._started:
            self._started = False
            self.receiver.on_stop()

    def shutdown(self) -> None:
        self._stopped = True
        self._stop_receiver()

    def wait_for(self, n: int, timeout_s: float = 15.0) -> list[Any]:
        """Wait until at least ``n`` records were stored; return them all."""
        with self._changed:
            ok = self._changed.wait_for(lambda: len(self.records) >= n, timeout_s)
            assert ok, f"only {len(self.records)} of {n} records stored after {timeout_s}s"
            return list(self.records)

    def wait_for_errors(self, n: int, timeout_s: float = 15.0) -> list[str]:
        with self._changed:
            ok = self._changed.wait_for(lambda: len(self.errors) >= n, timeout_s)
            assert ok, f"only {self.errors} reported after {timeout_s}s"
            return list(self.errors)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
