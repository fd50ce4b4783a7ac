"""A block keeper: an executor's received blocks, in a process that outlives the receivers.

Spark keeps received blocks in the executor's block manager, not in the receiver's
task, so a receiver task that dies loses no block; with a ``_2`` storage level a
copy is on a second executor before the driver hears of the block. Our receivers
run in Python workers, which die with their task, so each executor gets one
keeper process per streaming context (``python -m
spark_receivers.receiver.block_keeper``, started by
:func:`spark_receivers.receiver.keeper_process.ensure_local_keeper`): the
supervisors put every block in the keeper of their own executor and, for a
replicated level, in the keeper of another executor, before ``AddBlock``.

A keeper is an authenticated Arrow Flight endpoint (the context's secret):

* ``do_put`` takes a block (descriptor: ``{"block", "generated_ms", "use_disk"}``
  as JSON), kept in a :class:`~spark_receivers.receiver.block_store.BlockStore`
  (memory up to its budget, then local disk for levels that allow it);
* ``do_get`` serves a block to batch readers;
* ``AdoptBlock`` keeps a block a receiver of the same host wrote as an Arrow IPC
  file into the keeper's *spool* directory (named on the keeper's start line;
  ``receiver/block_spool.py``): the keeper maps the file and keeps it, and the
  mapped table, until the block is removed (a Parquet file, in local mode: only its
  footer is read, the block is decoded if a ``do_get`` asks for it) — the block's
  bytes are written once, neither side serializes them into gRPC messages (issue 31
  item 4: a ``do_put`` cost the keeper 0.11-0.13 core-seconds per million 100-byte
  lines, the file 0.04 in all; decision 0011), and a batch's read task on the same
  host maps the file instead of a ``do_get``. Files a receiver wrote but never
  handed over (it died in between) are swept after ``SPOOL_ORPHAN_S``;
* ``RemoveBlocks`` drops blocks whose batch completed (sent by the driver to
  every copy), and their spool files; ``ReleaseKeeper`` drops everything and ends
  the process (the context stopped); ``DescribeKeeper`` says what it holds.

It ends by itself when the process it watches (its executor's JVM) is gone:
blocks live as long as their executor, as Spark's do.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_receivers.errors import RpcError, StateError
from spark_receivers.receiver.block_spool import (
    ALIVE_FILE,
    PARQUET_SUFFIX,
    SPOOL_ORPHAN_S,
    NotOurFileError,
    close_quietly,
    is_spool_file,
    make_spool,
    map_spool_file,
    spool_file_rows,
    sweep_dead_spools,
)
from spark_receivers.receiver.block_store import BlockStore
from spark_receivers.receiver.storage_level import StorageLevel
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.tls import TlsConfig
from spark_receivers.rpc.transport import FlightEndpoint

log = logging.getLogger(__name__)

__all__ = ["BlockKeeper", "KeeperSettings", "process_alive"]


@dataclass(frozen=True)
class KeeperSettings:
    """What a keeper process is started with (sent on its stdin, never on its command line)."""

    secret: str
    host: str
    watch_pid: int
    watch_start: str = ""
    """The watched process's start time (``/proc/<pid>/stat``), so a reused pid is not it."""
    memory_budget_bytes: int = 512 * 1024 * 1024
    spill_dir: str | None = None
    max_message_bytes: int = 4 * 1024 * 1024
    bind_host: str = ""
    """Where to bind ('' = ``host``); ``host`` is what the keeper advertises."""
    ports: tuple[int, int] = (0, 0)
    """The ports it may take (``spark.receivers.executor.ports``; ``(0, 0)``: any)."""
    spool: bool = False
    """Take local blocks as files (``AdoptBlock``), in a spool directory under ``spill_dir``
    (or the temporary directory); False: every block by ``do_put``."""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_server_name: str = ""
    tls_client_auth: bool = False

    @property
    def tls(self) -> TlsConfig | None:
        """The keeper's TLS settings (None: plaintext)."""
        if not self.tls_cert_file:
            return None
        return TlsConfig(
            self.tls_cert_file,
            self.tls_key_file,
            self.tls_ca_file,
            self.tls_server_name or None,
            self.tls_client_auth,
        )


def process_start(pid: int) -> str:
    """The start time of process ``pid`` as the kernel tells it ('' when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def process_alive(pid: int, start: str = "") -> bool:
    """True while ``pid`` runs (and, when ``start`` is given, is the process that started then)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not start or process_start(pid) in (start, "")


class BlockKeeper:
    """The keeper server; see the module doc. Thread-safe."""

    def __init__(self, settings: KeeperSettings) -> None:
        self.settings = settings
        self.store = BlockStore(
            StorageLevel.MEMORY_AND_DISK, settings.memory_budget_bytes, settings.spill_dir
        )
        self._released = threading.Event()
        self.spool_dir, self._spool_lock = "", -1
        self._files: dict[str, str] = {}  # block id -> its spool file, kept until removed
        self._files_lock = threading.Lock()
        if settings.spool:
            parent = settings.spill_dir or tempfile.gettempdir()
            self.spool_dir, self._spool_lock = make_spool(parent)
            sweep_dead_spools(parent, keep=self.spool_dir)
        self._endpoint = FlightEndpoint(
            "block-keeper",
            settings.bind_host or settings.host,
            settings.secret,
            m.KEEPER_MESSAGES,
            self._handle,
            self._read,
            settings.max_message_bytes,
            tls=settings.tls,
            advertise_host=settings.host,
            ports=tuple(settings.ports),  # type: ignore[arg-type]
            block_writer=self._put,
        )

    @property
    def address(self) -> str:
        """``host:port`` supervisors and readers connect to."""
        return self._endpoint.address

    def serve(self, poll_s: float = 0.5) -> str:
        """Serve until released or the watched process is gone; return why it ended."""
        s = self.settings
        why = "released by the driver"
        swept_at = time.monotonic()
        while not self._released.wait(poll_s):
            if not process_alive(s.watch_pid, s.watch_start):
                why = f"process {s.watch_pid} (its executor) is gone"
                break
            if time.monotonic() - swept_at > SPOOL_ORPHAN_S / 4:
                swept_at = time.monotonic()
                self.sweep_spool()
        self.close()
        return why

    def close(self) -> None:
        """Stop serving and drop every block and the spool; idempotent.

        The spool's lock goes first: from then on no read task maps a file of it, so
        its blocks are gone for readers no later than the port closes.
        """
        self._released.set()
        with self._files_lock:
            lock, self._spool_lock = self._spool_lock, -1
            self._files.clear()
        close_quietly(lock)
        self._endpoint.close()
        self.store.clear()
        if self.spool_dir:
            shutil.rmtree(self.spool_dir, ignore_errors=True)

    def sweep_spool(self, older_than_s: float = SPOOL_ORPHAN_S) -> int:
        """Delete spool files nobody handed over within ``older_than_s``; return how many."""
        if not self.spool_dir:
            return 0
        swept = 0
        cutoff = time.time() - older_than_s
        try:
            entries = list(os.scandir(self.spool_dir))
        except OSError:
            return 0
        with self._files_lock:
            kept = set(self._files.values())
        for entry in entries:
            if entry.name == ALIVE_FILE or entry.path in kept:
                continue
            try:
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    swept += 1
            except OSError:
                continue  # adopted (unlinked) meanwhile
        if swept:
            log.warning("swept %d block file(s) no receiver handed over from the spool", swept)
        return swept

    def adopt(self, message: m.AdoptBlock) -> bool:
        """Keep the block a local receiver wrote into the spool (see the module doc)."""
        m.StreamBlockId.parse(message.block_id)
        name = message.file
        if not self.spool_dir or not is_spool_file(name, message.block_id):
            msg = (
                f"AdoptBlock of {message.block_id}: {name!r:.120} is not a block file of this "
                "keeper's spool (a bare name, <block id>.<nonce>.arrow or .parquet)"
            )
            raise RpcError(msg)
        if self._released.is_set():
            msg = "this block keeper was released: its context stopped"
            raise StateError(msg)
        path = os.path.join(self.spool_dir, name)
        parquet = name.endswith(PARQUET_SUFFIX)
        try:
            # Parquet (local mode): the footer only; the block is decoded if a fetch asks.
            kept = spool_file_rows(path) if parquet else map_spool_file(path)
        except NotOurFileError as e:
            msg = f"AdoptBlock of {message.block_id}: {e}"
            raise RpcError(msg) from None
        except (OSError, pa.ArrowInvalid) as e:
            how = "read the Parquet footer of" if parquet else "map"
            msg = f"AdoptBlock of {message.block_id}: could not {how} {name}: {e}"
            raise RpcError(msg) from None
        # Kept (and mapped) until the block is removed: read tasks of this host map it too.
        with self._files_lock:
            replaced = self._files.get(message.block_id)
            self._files[message.block_id] = path
        if replaced is not None and replaced != path:
            _unlink(replaced)
        if isinstance(kept, pa.Table):
            self.store.put(message.block_id, kept, message.generated_ms, message.use_disk, path)
        else:
            rows, size = kept
            self.store.put_file(message.block_id, path, rows, size, message.generated_ms)
        return True

    def remove(self, block_ids: tuple[str, ...] | list[str]) -> int:
        """Drop blocks and their spool files; return how many blocks were here."""
        n = self.store.remove(block_ids)
        with self._files_lock:
            files = [self._files.pop(b) for b in block_ids if b in self._files]
        for path in files:
            _unlink(path)
        return n

    def describe(self) -> dict[str, Any]:
        """What the keeper holds: blocks, bytes in memory and on disk, its pid."""
        return {
            "blocks": len(self.store),
            "memory_bytes": self.store.memory_bytes,
            "disk_bytes": self.store.disk_bytes,
            "pid": os.getpid(),
        }

    def _put(self, command: bytes, table: pa.Table) -> None:
        try:
            spec = json.loads(command.decode("utf-8"))
            name, generated_ms = spec["block"], spec["generated_ms"]
            use_disk = bool(spec.get("use_disk", True))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            msg = f"a block put needs a JSON descriptor with block and generated_ms: {e}"
            raise RpcError(msg) from None
        m.StreamBlockId.parse(name)
        if not isinstance(generated_ms, int) or isinstance(generated_ms, bool):
            msg = f"generated_ms of block {name} must be an integer, got {generated_ms!r:.40}"
            raise RpcError(msg)
        if self._released.is_set():
            msg = "this block keeper was released: its context stopped"
            raise StateError(msg)
        self.store.put(name, table, generated_ms, use_disk)

    def _read(self, ticket: bytes) -> pa.Table:
        name = ticket.decode("ascii", "replace")
        m.StreamBlockId.parse(name)
        return self.store.get(name)

    def _handle(self, message: m.KeeperMessage) -> Any:
        match message:
            case m.RemoveBlocks(block_ids=ids):
                return self.remove(ids)
            case m.ReleaseKeeper():
                threading.Thread(target=self.close, name="keeper-release", daemon=True).start()
                return True
            case m.DescribeKeeper():
                return self.describe()
            case m.AdoptBlock():
                return self.adopt(message)
        msg = f"unexpected message {message!r:.100}"
        raise RpcError(msg)


def main() -> int:
    """Run a keeper: settings as JSON on stdin, its address as one JSON line on stdout."""
    logging.basicConfig(
        level=os.environ.get("SPARK_RECEIVERS_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s block-keeper[%(process)d] %(name)s: %(message)s",
    )
    raw = json.loads(sys.stdin.read())
    settings = KeeperSettings(**{**raw, "ports": tuple(raw.get("ports", (0, 0)))})
    keeper = BlockKeeper(settings)
    started = {"address": keeper.address, "pid": os.getpid(), "spool_dir": keeper.spool_dir}
    sys.stdout.write(json.dumps(started) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the starter stops reading: later writes must not hit a closed pipe
    log.info("block keeper at %s for process %d", keeper.address, settings.watch_pid)
    why = keeper.serve()
    log.info("block keeper at %s ends: %s", keeper.address, why)
    return 0


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not delete spool file %s: %s", path, e)


if __name__ == "__main__":
    raise SystemExit(main())
