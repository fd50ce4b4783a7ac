"""The source of a chaos run, and its ground truth: a redis-server of our own, a producer, XPENDING.

:class:`RedisServer` runs ``redis-server`` on a free port of 127.0.0.1 in a directory
of the run (no persistence: the stream lives as long as the run), stopped by PID.
:class:`Producer` adds numbered records (``value`` = ``"0"``, ``"1"``, ...) at a
steady rate with a server-side script (one call adds a tick's worth), so the offered
load costs the harness little CPU. :class:`Group` reads what the stream itself says:
how many entries were added, how many the group delivered, which are pending.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import redis

_ADD = """
local n = tonumber(ARGV[2])
local first = tonumber(ARGV[1])
for i = 0, n - 1 do
  redis.call('XADD', KEYS[1], '*', 'value', tostring(first + i))
end
return n
"""
_ADD_LINES = """
local n = tonumber(ARGV[2])
local first = tonumber(ARGV[1])
for i = 0, n - 1 do
  local s = first + i
  local words = {}
  for k = 1, 8 do
    words[k] = 'w' .. tostring((s * 7919 + k * 104729) % 1000)
  end
  redis.call('XADD', KEYS[1], '*', 'value', table.concat(words, ' '))
end
return n
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """``redis-server`` on 127.0.0.1, in ``root``; :meth:`stop` ends it by PID."""

    def __init__(self, root: Path) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise RuntimeError("redis-server is not installed: scripts/services.sh install redis")
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = root / "redis.log"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(root)]
        args += ["--save", "", "--appendonly", "no", "--logfile", str(self.log)]
        self.proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL)
        client = self.client()
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not start: {self.log}") from None
                time.sleep(0.1)
        client.close()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=30)

    def used_memory(self) -> int:
        client = self.client()
        try:
            return int(client.info("memory")["used_memory"])
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Producer:
    """Adds records ``0, 1, 2, ...`` to ``stream`` at ``rate``/s (ticks of 10 ms) until stopped.

    With ``words=True`` each record is a line of 8 words out of 1,000 (the soak's word
    count); ``first`` numbers the first record.
    """

    def __init__(
        self, server: RedisServer, stream: str, rate: float, words: bool = False, first: int = 0
    ) -> None:
        self.stream = stream
        self.rate = rate
        self.sent = 0
        self._first = first
        self._client = server.client()
        self._add = self._client.register_script(_ADD_LINES if words else _ADD)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            while not self._stop.wait(0.01):  # pacing of the load generator
                due = int((time.monotonic() - started) * self.rate)
                n = min(due - self.sent, max(1, int(self.rate)))  # at most a second behind
                if n > 0:
                    self._add(keys=[self.stream], args=[self._first + self.sent, n])
                    self.sent += n
        except BaseException as e:  # recorded: the run fails with it
            self.error = e

    def fill(self, n: int, chunk: int = 10_000) -> None:
        """Add ``n`` records at once (a backlog), on the caller's thread."""
        for start in range(0, n, chunk):
            count = min(chunk, n - start)
            self._add(keys=[self.stream], args=[self._first + self.sent, count])
            self.sent += count

    def stop(self) -> int:
        """Stop adding; return how many records were added."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self._client.close()
        return self.sent


class Group:
    """The consumer group ``group`` of ``stream`` as Redis sees it."""

    def __init__(self, server: RedisServer, stream: str, group: str) -> None:
        self.stream, self.group = stream, group
        self._client = server.client()
        self._lock = threading.Lock()
        with contextlib.suppress(redis.ResponseError):  # BUSYGROUP: made already
            self._client.xgroup_create(stream, group, id="0", mkstream=True)

    def _info(self) -> dict[str, Any]:
        for info in self._client.xinfo_groups(self.stream):
            name = info["name"]
            if (name.decode() if isinstance(name, bytes) else name) == self.group:
                return info
        raise RuntimeError(f"no group {self.group} on {self.stream}")

    def counts(self) -> tuple[int, int, int]:
        """``(added, read, pending)``: entries in the stream, delivered to the group, unacked."""
        with self._lock:
            added = int(self._client.xinfo_stream(self.stream)["entries-added"])
            info = self._info()
        return added, int(info["entries-read"] or 0), int(info["pending"])

    def acked(self) -> int:
        """Entries the group delivered and had acknowledged."""
        _, read, pending = self.counts()
        return read - pending

    def pending_values(self) -> set[int]:
        """The records of every pending entry (read, not acknowledged): a crash redelivers them."""
        with self._lock:
            ids = [p["message_id"] for p in self._client.xpending_range(
                self.stream, self.group, "-", "+", 10_000_000)]  # fmt: skip
            values: set[int] = set()
            pipe = self._client.pipeline(transaction=False)
            for eid in ids:
                pipe.xrange(self.stream, eid, eid)
            for found in pipe.execute() if ids else []:
                for _, fields in found:
                    values.add(int(fields[b"value"]))
        return values

    def all_acked(self, sent: int) -> bool:
        """Every one of ``sent`` records delivered to the group and acknowledged."""
        added, read, pending = self.counts()
        return added == sent and read == sent and pending == 0

    def close(self) -> None:
        self._client.close()
