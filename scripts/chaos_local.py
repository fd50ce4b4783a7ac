"""Zero-loss chaos run: kill -9 a reliable receiver's Python worker, again and again.

A source in this process (a TCP server) hands out sequence-numbered records and
keeps an independent count of what it was acknowledged; a reliable receiver
stores each chunk with ``store(..., reliable=True)`` and only then acknowledges
it (a cumulative ACK). Both write-ahead logs are on. While records flow, the
receiver's Python worker is killed with SIGKILL ``--kills`` times; the tracker
relaunches it and the source redelivers everything not acknowledged, as a
broker would. At the end::

    acked       = records the receiver acknowledged     (must be every record sent)
    lost        = acked records missing from every batch's output   (must be 0)
    duplicated  = records delivered more than once
    bad dups    = duplicated records the source sent only once       (must be 0)

``tests/integration/test_zero_loss.py`` runs a short version (``make chaos`` is the
cluster chaos of scripts/chaos.py: every fault kind at load). With ``--json`` the last
line is a JSON summary. Exit status 0 only when every record sent was acknowledged,
nothing acknowledged was lost and no record sent once was delivered twice (an
unacknowledged record is a record the run cannot vouch for, so it fails the run rather
than being left out of the count).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from spark_receivers import Receiver, StreamingConfig, StreamingContext


class AckingSource:
    """A TCP source of numbered records that counts cumulative acknowledgements.

    One receiver connection at a time (a new one replaces the old). On every
    connection it sends from the oldest unacknowledged record, at most
    ``window`` records ahead of the acknowledged ones, ``rate`` records/s.
    The receiver may send ``PID <pid>`` and ``ACK <seq>`` lines.
    """

    def __init__(self, rate: int, window: int = 5_000) -> None:
        self.rate = rate
        self.window = window
        self.cond = threading.Condition()
        self.committed = 0  # every seq below it is acknowledged
        self.next_seq = 0  # next seq to send on the current connection
        self.highest_sent = -1
        self.limit: int | None = None  # no new records from here on, once set
        self.send_counts: collections.Counter[int] = collections.Counter()
        self.pid: int | None = None
        self.connections = 0
        self._conn: socket.socket | None = None
        self._closed = False
        self._server = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self._server.getsockname()[:2]
        self._threads = [
            threading.Thread(target=self._accept, name="chaos-source-accept", daemon=True),
            threading.Thread(target=self._send, name="chaos-source-send", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self.cond:
                old, self._conn = self._conn, conn
                self.next_seq = self.committed  # redeliver what was not acknowledged
                self.pid = None
                self.connections += 1
                self.cond.notify_all()
            if old is not None:
                _close(old)
            threading.Thread(
                target=self._read, args=(conn,), name="chaos-source-read", daemon=True
            ).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                kind, _, value = line.decode().partition(" ")
                with self.cond:
                    if kind == "ACK":
                        self.committed = max(self.committed, int(value) + 1)
                    elif kind == "PID" and conn is self._conn:
                        self.pid = int(value)
                    self.cond.notify_all()

    def _send(self) -> None:
        chunk = max(1, self.rate // 50)
        pause = chunk / self.rate
        while not self._closed:
            with self.cond:
                conn = self._conn
                end = self.next_seq + chunk
                end = min(end, self.committed + self.window)
                if self.limit is not None:
                    end = min(end, self.limit)
                seqs = range(self.next_seq, end) if conn is not None else range(0)
                self.next_seq = max(self.next_seq, end) if conn is not None else self.next_seq
            if seqs:
                try:
                    assert conn is not None
                    conn.sendall("".join(f"{s}\n" for s in seqs).encode())
                except OSError:
                    pass
                else:
                    with self.cond:
                        self.send_counts.update(seqs)
                        self.highest_sent = max(self.highest_sent, seqs[-1])
            time.sleep(pause)  # pacing of the test source, not synchronisation

    def finish(self) -> int:
        """Stop making new records; return how many distinct records exist."""
        with self.cond:
            self.limit = self.highest_sent + 1
            return self.limit

    def wait_for(self, predicate: Any, timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds (under the source's lock)."""
        with self.cond:
            return self.cond.wait_for(predicate, timeout_s)

    def close(self) -> None:
        """Close the server and the connection."""
        self._closed = True
        _close(self._server)
        with self.cond:
            conn, self._conn = self._conn, None
        if conn is not None:
            _close(conn)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class ReliableTcpReceiver(Receiver):
    """Reads numbered lines; stores each chunk reliably, then acknowledges it."""

    def __init__(self, host: str, port: int, max_chunk: int = 200) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self.max_chunk = max_chunk
        self._sock: socket.socket | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_sock"] = None
        return state

    def on_start(self) -> None:
        """Connect and receive on a thread of its own."""
        threading.Thread(target=self._run, name="reliable-receiver", daemon=True).start()

    def on_stop(self) -> None:
        """Close the connection; the thread sees it and ends."""
        sock, self._sock = self._sock, None
        if sock is not None:
            _close(sock)

    def _run(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=5)
        except OSError as e:
            self.restart("cannot connect to the source", e, 200)
            return
        self._sock = sock
        sock.settimeout(0.05)
        buf = b""
        pending: list[str] = []
        try:
            sock.sendall(f"PID {os.getpid()}\n".encode())
            while not self.is_stopped():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    data = None
                if data == b"":
                    msg = "the source closed the connection"
                    raise ConnectionError(msg)  # noqa: TRY301 - handled below like any I/O error
                if data:
                    buf += data
                    *lines, buf = buf.split(b"\n")
                    pending.extend(x.decode() for x in lines if x)
                    if len(pending) < self.max_chunk:
                        continue
                while pending:
                    chunk, pending = pending[: self.max_chunk], pending[self.max_chunk :]
                    self.store(chunk, reliable=True)  # stored, in the WAL, and reported
                    sock.sendall(f"ACK {chunk[-1]}\n".encode())
        except Exception as e:  # noqa: BLE001 - anything: reconnect, the source redelivers
            if not self.is_stopped():
                self.restart("source connection or store failed", e, 200)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the scenario; return the summary (see the module doc)."""
    from pyspark.sql import SparkSession

    rng = random.Random(args.seed)
    ckpt = tempfile.mkdtemp(prefix="spark-receivers-chaos-")
    spark = (
        SparkSession.builder.master("local[3]")
        .appName("spark-receivers-chaos")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("OFF")
    source = AckingSource(args.rate)
    delivered: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()
    started = time.monotonic()
    kills = 0
    out: dict[str, Any] = {}
    cfg = StreamingConfig(
        receiver_wal_enabled=True,
        receiver_restart_delay_ms=300,
        block_interval_ms=200,
        receiver_drain_timeout_s=5.0,
    )
    ssc = StreamingContext(spark, args.batch_ms, checkpoint_dir=ckpt, config=cfg)
    try:
        stream = ssc.receiver_stream(ReliableTcpReceiver(source.host, source.port))

        def collect(df: Any, batch_time_ms: int) -> None:
            values = [int(r.value) for r in df.collect()]
            with lock:
                delivered.update(values)

        stream.foreach_batch(collect)
        ssc.start()
        while kills < args.kills:
            # Let records flow for a while, then kill the worker mid-stream.
            before = source.committed
            if not source.wait_for(
                lambda b=before: source.pid is not None and source.committed > b + args.rate // 10,
                120,
            ):
                out["error"] = f"no progress before kill {kills + 1}"
                break
            time.sleep(rng.uniform(0.05, args.max_gap_s))  # a random point in the stream
            with source.cond:
                pid, conns = source.pid, source.connections
            if pid is None:
                continue
            os.kill(pid, signal.SIGKILL)
            kills += 1
            if not args.json:
                print(
                    f"{time.monotonic() - started:6.1f}s kill {kills}: worker {pid} "
                    f"(acked so far {source.committed})",
                    flush=True,
                )
            # Wait for the receiver to come back on a new connection before the next kill.
            source.wait_for(lambda c=conns: source.connections > c, 120)
        total = source.finish()
        if not args.json:
            print(f"{time.monotonic() - started:6.1f}s kills done; draining", flush=True)
        all_acked = source.wait_for(lambda: source.committed >= total, args.drain_s)

        def all_delivered() -> bool:
            with lock:
                return all(delivered[s] > 0 for s in range(source.committed))

        deadline = time.monotonic() + args.drain_s
        while not all_delivered() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not args.json:
            print(f"{time.monotonic() - started:6.1f}s delivered; stopping", flush=True)
    finally:
        ssc.stop(graceful=True)
        source.close()
        spark.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    acked = source.committed
    with lock:
        lost = [s for s in range(acked) if delivered[s] == 0]
        dups = {s: c for s, c in delivered.items() if c > 1}
        bad_dups = [s for s in dups if source.send_counts[s] <= 1]
        unknown = [s for s in delivered if s > source.highest_sent]
        out.update(
            sent=source.highest_sent + 1,
            acked=acked,
            all_acked=all_acked,
            delivered=len(delivered),
            delivered_total=sum(delivered.values()),
            lost=len(lost),
            lost_sample=lost[:10],
            duplicated=len(dups),
            bad_duplicates=len(bad_dups),
            bad_duplicates_sample=sorted(bad_dups)[:10],
            redelivered_by_source=sum(1 for c in source.send_counts.values() if c > 1),
            never_sent_delivered=len(unknown),
            kills=kills,
            connections=source.connections,
            seconds=round(time.monotonic() - started, 1),
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; exit status 0 when every record sent was acked and none lost."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=25)
    parser.add_argument("--rate", type=int, default=2_000, help="records/s from the source")
    parser.add_argument("--batch-ms", type=int, default=1_000)
    parser.add_argument("--max-gap-s", type=float, default=2.0, help="max wait before a kill")
    parser.add_argument("--drain-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="last line: a JSON summary")
    args = parser.parse_args(argv)
    out = run(args)
    ok = (
        "error" not in out
        and out["lost"] == 0
        and out["bad_duplicates"] == 0
        and out["never_sent_delivered"] == 0
        and out["acked"] > 0
        and out["all_acked"]
        and out["acked"] == out["sent"]
    )
    out["ok"] = ok
    if args.json:
        print(json.dumps(out), flush=True)
    else:
        for key in ("sent", "acked", "delivered", "lost", "duplicated", "bad_duplicates", "kills"):
            print(f"{key:>15}: {out.get(key)}")
        acked_all = out.get("all_acked") and out.get("acked") == out.get("sent")
        print(f"{'all sent acked':>15}: {'yes' if acked_all else 'NO'}")
        print(f"{'result':>15}: {'OK' if ok else 'FAILED'} in {out['seconds']} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
