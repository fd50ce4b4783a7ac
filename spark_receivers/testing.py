"""Helpers for testing code built on spark-receivers: a manual clock and test receivers.

* :class:`StandInTracker` and :func:`supervise` run a receiver under the real
  :class:`ReceiverSupervisor` (block generator, block store, Flight block server,
  authenticated RPC) against a driver stand-in, without Spark; the tracker
  records every message and :meth:`StandInTracker.stored_table` reads back what
  the receiver stored.
* :class:`ManualClock` moves only when told, for code that takes a clock.
* :class:`SequenceReceiver` and :class:`CountingReceiver` feed a pipeline known
  records on local Spark.
* :func:`start_connect_server` and :func:`stop_connect_server` run a Spark Connect
  server from the installed pyspark in a process of its own, on loopback, to test a
  pipeline through a Connect client session (``SparkSession.builder.remote``).

docs/testing.md walks through them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from spark_receivers.config import StreamingConfig
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.supervisor import ReceiverSupervisor
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint
from spark_receivers.util.clock import ManualClock

__all__ = [
    "CONNECT_ENV",
    "CountingReceiver",
    "ManualClock",
    "SequenceReceiver",
    "StandInTracker",
    "start_connect_server",
    "stop_connect_server",
    "supervise",
]

CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
"""The environment variables that make pyspark a Connect client; a server's process must
not inherit them (:func:`start_connect_server` removes them)."""
_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class SequenceReceiver(Receiver):
    """Stores a fixed list of string records, then idles until stopped.

    ``mode`` says how: ``"one"`` (one ``store`` per record), ``"list"`` (lists of
    ``chunk`` records), ``"arrow"`` (Arrow record batches of ``chunk`` rows),
    ``"pandas"`` (pandas frames), ``"reliable"`` (lists with ``reliable=True``),
    or ``"mixed"`` (each of the above in turn).
    """

    MODES = ("one", "list", "arrow", "pandas", "reliable")

    def __init__(self, records: Sequence[str], mode: str = "mixed", chunk: int = 100) -> None:
        super().__init__()
        if mode not in (*self.MODES, "mixed"):
            msg = f"mode must be one of {(*self.MODES, 'mixed')}, got {mode!r}"
            raise ValueError(msg)
        self.records = list(records)
        self.mode = mode
        self.chunk = chunk
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_thread"] = None
        return state

    def on_start(self) -> None:
        """Start storing on a thread of its own."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def on_stop(self) -> None:
        """Nothing to release."""

    def _run(self) -> None:
        import pandas as pd
        import pyarrow as pa

        chunks = [self.records[i : i + self.chunk] for i in range(0, len(self.records), self.chunk)]
        for i, part in enumerate(chunks):
            mode = self.MODES[i % len(self.MODES)] if self.mode == "mixed" else self.mode
            if mode == "one":
                for r in part:
                    self.store(r)
            elif mode == "list":
                self.store(part)
            elif mode == "arrow":
                self.store(pa.RecordBatch.from_pydict({"value": part}))
            elif mode == "pandas":
                self.store(pd.DataFrame({"value": part}))
            else:
                self.store(part, reliable=True)


class CountingReceiver(Receiver):
    """Stores numbered records (``"<stream>-<n>"``) at ``rate`` records/s until stopped.

    Records are stored in lists of ``rate / 20`` every 50 ms; ``n`` starts again
    at 0 after a restart of the task (the receiver object is re-sent). With
    ``rate=0`` it stores nothing and only runs. With ``offsets=True`` each list is
    stored with ``metadata={"offset": <n after it>}``, as a source with offsets would
    (each list is then a block of its own).
    """

    def __init__(
        self, rate: int = 100, preferred_location: str | None = None, offsets: bool = False
    ) -> None:
        super().__init__(preferred_location=preferred_location)
        self.rate = rate
        self.offsets = offsets
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_thread"] = None
        return state

    def on_start(self) -> None:
        """Start storing on a thread of its own."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def on_stop(self) -> None:
        """The storing thread sees ``is_stopped`` and ends."""

    def _run(self) -> None:
        n = 0
        per_tick = max(1, self.rate // 20)
        pause = threading.Event()
        while self.rate <= 0 and not self.is_stopped():
            pause.wait(0.05)
        while not self.is_stopped():
            try:
                records = [f"{self.stream_id}-{i}" for i in range(n, n + per_tick)]
                self.store(records, metadata={"offset": n + per_tick} if self.offsets else None)
            except Exception:  # noqa: BLE001 - stopping while storing ends the loop
                return
            n += per_tick
            pause.wait(0.05)


class StandInTracker:
    """A real tracker endpoint (Flight, authenticated) that records what it gets.

    For testing a receiver without Spark: run it under a real
    :class:`ReceiverSupervisor` with :func:`supervise`, then look at the
    messages it sent. Replies to ``RegisterReceiver`` and to ``AddBlock``/``AddBlocks``
    (per block) with ``accept_register``/``accept_blocks``; :meth:`blocks` lists the
    blocks reported either way. It knows of no other executor, so supervisors keep
    one copy of each block, in the block keeper they start. Close it with
    :meth:`close` (which also ends those keepers).
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.secret = new_secret()
        self.accept_register = True
        self.accept_blocks = True
        self.messages: list[object] = []
        self.cond = threading.Condition()
        self.endpoint = FlightEndpoint(
            "tracker", host, self.secret, m.TRACKER_MESSAGES, self._handle
        )

    def _handle(self, msg: object) -> object:
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()
        if isinstance(msg, m.RegisterReceiver):
            return self.accept_register
        if isinstance(msg, m.AddBlock):
            return self.accept_blocks
        if isinstance(msg, m.AddBlocks):
            return [self.accept_blocks] * len(msg.block_infos)
        if isinstance(msg, m.GetAcceptedPosition):
            if not self.accept_blocks:
                return None
            positions = [
                b.position
                for b in self.blocks()
                if b.stream_id == msg.stream_id and b.position is not None
            ]
            return positions[-1] if positions else None
        if isinstance(msg, m.GetReplicaTargets):
            return []
        if isinstance(msg, m.ReportReplication | m.ReportLostBlock):
            return None
        return True

    def of(self, kind: type) -> list[Any]:
        """The messages received of one type, in order."""
        with self.cond:
            return [x for x in self.messages if isinstance(x, kind)]

    def wait_for(self, predicate: Any, timeout_s: float = 15.0) -> None:
        """Wait until ``predicate()`` holds; AssertionError on timeout."""
        with self.cond:
            if not self.cond.wait_for(predicate, timeout_s):
                msg = f"timed out after {timeout_s}s; last messages: {self.messages[-5:]}"
                raise AssertionError(msg)

    def blocks(self) -> list[m.ReceivedBlockInfo]:
        """Every block reported so far (``AddBlock`` or ``AddBlocks``), in report order."""
        with self.cond:
            out: list[m.ReceivedBlockInfo] = []
            for x in self.messages:
                if isinstance(x, m.AddBlock):
                    out.append(x.block_info)
                elif isinstance(x, m.AddBlocks):
                    out.extend(x.block_infos)
            return out

    def records(self) -> int:
        """Records in every block reported so far."""
        return sum(info.num_records for info in self.blocks())

    def stored_table(self, supervisor: ReceiverSupervisor) -> pa.Table:
        """Every block ``supervisor`` reported, read back from where it was kept, in order.

        A real, authenticated Arrow Flight read from where each block was kept (its
        block keeper), as a batch's read task makes it; blocks are in report order,
        records in store order within a block.
        """
        blocks = []
        for info in self.blocks():
            if info.stream_id != supervisor.stream_id:
                continue
            client = EndpointClient(info.locations[0], self.secret)
            try:
                blocks.append(client.read_table(info.block_id.encode()))
            finally:
                client.close()
        if not blocks:
            return supervisor.receiver.schema.empty_table()
        return pa.concat_tables(blocks)

    def release(self, supervisor: ReceiverSupervisor) -> None:
        """Tell ``supervisor`` that no batch will read its blocks (the driver's last word).

        A stopped supervisor serves its blocks until released (or its drain
        timeout): after this its task ends at once.
        """
        client = EndpointClient(supervisor.endpoint, self.secret)
        try:
            client.call(m.ReleaseReceiver())
        finally:
            client.close()

    def close(self) -> None:
        """Stop the endpoint and end the block keepers that registered with it."""
        self.endpoint.close()
        for keeper in {k.endpoint for k in self.of(m.RegisterBlockKeeper)}:
            client = EndpointClient(keeper, self.secret, timeout_s=5.0)
            try:
                client.call(m.ReleaseKeeper())
            except Exception:  # noqa: BLE001 - already gone: nothing to end
                pass
            finally:
                client.close()


def supervise(
    tracker: StandInTracker, receiver: Receiver, stream_id: int = 0, **config: Any
) -> ReceiverSupervisor:
    """A supervisor for ``receiver`` reporting to ``tracker`` (not started yet)."""
    cfg = StreamingConfig(**{"block_interval_ms": 50, "receiver_drain_timeout_s": 5.0, **config})
    return ReceiverSupervisor(
        receiver, stream_id, tracker.endpoint.address, tracker.secret, cfg, "127.0.0.1", "driver"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def start_connect_server(
    log: Path,
    master: str = "local[3]",
    conf: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    app_name: str = "spark-receivers-connect-tests",
    timeout_s: float = 180.0,
) -> tuple[subprocess.Popen[bytes], int]:
    """A Spark Connect server from the installed pyspark on a free loopback port.

    Runs ``$SPARK_HOME/bin/spark-submit --class SparkConnectServer --master MASTER`` of
    the pyspark package in a process of its own (its output to ``log``), bound to
    127.0.0.1, UI off, its Python workers on this interpreter. ``conf``: more
    ``--conf`` entries (they win over those defaults); ``env``: its environment (this
    process's by default, without :data:`CONNECT_ENV`). Returns once the gRPC port
    accepts connections: ``(process, port)``, the client's URL being
    ``sc://127.0.0.1:PORT``. Raises ``RuntimeError`` with the log's tail when the server
    exits or does not listen within ``timeout_s``. Stop it with
    :func:`stop_connect_server`.
    """
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    port = _free_port()
    confs = {
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.pyspark.python": sys.executable,
        **(conf or {}),
    }
    cmd = [str(home / "bin" / "spark-submit"), "--class", _SERVER_CLASS, "--master", master]
    cmd += ["--name", app_name]
    cmd += [x for key, value in confs.items() for x in ("--conf", f"{key}={value}")]
    environ = {
        **(os.environ if env is None else env),
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
    }
    for key in CONNECT_ENV:
        environ.pop(key, None)
    with Path(log).open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=environ)
    deadline = time.monotonic() + timeout_s
    # Another process's port: nothing to wait on but the port itself.
    while not _listening(port) and proc.poll() is None and time.monotonic() < deadline:
        threading.Event().wait(0.05)
    if not _listening(port):
        stop_connect_server(proc)
        tail = Path(log).read_text(errors="replace")[-3000:]
        msg = f"the Connect server did not listen on 127.0.0.1:{port}: {tail}"
        raise RuntimeError(msg)
    return proc, port


def stop_connect_server(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM the server by its PID; SIGKILL when it has not exited after ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
