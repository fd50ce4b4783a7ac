"""Where a receiver's blocks go before ``AddBlock``: block keepers, or the task itself.

A :class:`BlockSink` takes a cut block and returns where its copies are:

* :class:`KeeperSink` (the default, ``spark.receivers.blockKeeper.enabled``): the
  first copy in the block keeper of this executor (it outlives the receiver's
  task), and for a replicated level (``MEMORY_AND_DISK_2``, ``MEMORY_ONLY_2``)
  one more in the keeper of another executor, sent in parallel and acknowledged
  before the call returns — so the driver only ever hears of a block that is
  already where the level says. Other executors' keepers come from the driver
  (``GetReplicaTargets``, refreshed every few seconds and after a failed put).
  When none answers, the block is kept once and the level is *degraded*: a
  warning, and ``ReportReplication`` to the driver (listeners and the status see
  it); the next block that gets its copies again reports the level restored.
* :class:`InProcessSink`: in the receiver task's own
  :class:`~spark_receivers.receiver.block_store.BlockStore`, served by its block
  server; blocks die with the task (keepers off, or tests without processes).

Thread-safety: ``put`` is called by the block pushing thread and by receivers
storing reliably, possibly at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import errno
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import BlockStoreError, RpcError
from spark_receivers.receiver.block_keeper import KeeperSettings
from spark_receivers.receiver.block_spool import (
    PARQUET_SUFFIX,
    SPOOL_SUFFIX,
    parquet_spool_schema,
    spool_file_name,
)
from spark_receivers.receiver.block_store import BlockStore
from spark_receivers.receiver.keeper_process import KeeperHandle, ensure_local_keeper
from spark_receivers.receiver.storage_level import StorageLevel
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.util.clock import Clock, SystemClock

log = logging.getLogger(__name__)

__all__ = [
    "BlockSink",
    "InProcessSink",
    "KeeperHoldings",
    "KeeperSink",
    "Placed",
    "effective_level",
    "keeper_settings",
    "keeper_sink",
]


@dataclass(frozen=True)
class KeeperHoldings:
    """What a block keeper holds: bytes in memory and on disk, and blocks (a store's view)."""

    memory_bytes: int = 0
    disk_bytes: int = 0
    blocks: int = 0

    def __len__(self) -> int:
        return self.blocks


@dataclass(frozen=True)
class Placed:
    """A block's size in memory and the endpoints holding its copies, the first copy first.

    ``local_file``: the first copy's file in its keeper's spool, which read tasks on that
    host map (``receiver/block_spool.py``); None when the block went by a put.
    """

    size_bytes: int
    locations: tuple[str, ...]
    local_file: str | None = None


class BlockSink(Protocol):
    """Keeps blocks somewhere readers can fetch them."""

    def put(self, name: str, table: pa.Table, generated_ms: int) -> Placed:
        """Keep a block; raise when its first copy could not be kept."""
        ...

    def remove(self, name: str, locations: Sequence[str]) -> None:
        """Drop a block from where it was put (it was never reported)."""
        ...

    def close(self) -> None:
        """Release threads and connections; idempotent."""
        ...


class InProcessSink:
    """Blocks in the task's own block store, served by its block server at ``endpoint()``."""

    def __init__(self, store: BlockStore, endpoint: Callable[[], str]) -> None:
        self.store = store
        self._endpoint = endpoint

    def put(self, name: str, table: pa.Table, generated_ms: int) -> Placed:
        """Put the block in the task's store."""
        return Placed(self.store.put(name, table, generated_ms), (self._endpoint(),))

    def remove(self, name: str, locations: Sequence[str]) -> None:
        """Drop the block from the task's store."""
        self.store.remove([name])

    def close(self) -> None:
        """Nothing to release."""


class _Caller(Protocol):
    def call(self, message: object, timeout_s: float | None = None) -> object: ...


class _Client(_Caller, Protocol):
    def put_table(
        self, command: bytes, table: pa.Table, timeout_s: float | None = None
    ) -> None: ...

    def close(self) -> None: ...


class KeeperSink:
    """Blocks in block keepers: this executor's, plus other executors' for replicas.

    ``local(restart)`` returns this executor's keeper (starting it, or a new one
    when ``restart``); ``tracker`` is the driver's client (``RegisterBlockKeeper``,
    ``GetReplicaTargets``, ``ReportReplication``); ``client(address)`` makes a
    keeper client.
    """

    def __init__(
        self,
        stream_id: int,
        executor_id: str,
        host: str,
        level: StorageLevel,
        local: Callable[[bool], KeeperHandle],
        tracker: _Caller,
        client: Callable[[str], _Client],
        timeout_s: float,
        clock: Clock | None = None,
        refresh_s: float = 5.0,
        parquet_spool: bool = False,
    ) -> None:
        self.stream_id = stream_id
        self.executor_id = executor_id
        self.host = host
        self.level = level
        self._local = local
        self._tracker = tracker
        self._client = client
        self._timeout_s = timeout_s
        self._clock = clock or SystemClock()
        self._refresh_ms = refresh_s * 1000
        self._lock = threading.Lock()
        self._clients: dict[str, _Client] = {}
        self._keeper: KeeperHandle | None = None
        self._targets: list[str] = []
        self._targets_at: float | None = None
        self._copies: int | None = None
        self._closing = False
        self._spool_failed = False
        self._parquet_spool = parquet_spool
        """Spool files as Parquet where the schema allows (local mode; the driver decides)."""
        self._parquet_schema: tuple[pa.Schema, bool] | None = None
        self._pool = cf.ThreadPoolExecutor(
            max(2, level.replication), thread_name_prefix=f"receiver-{stream_id}-replica"
        )

    @property
    def copies(self) -> int | None:
        """How many copies the last block got (None before the first)."""
        return self._copies

    def start(self, restart: bool = False) -> KeeperHandle:
        """Find or start this executor's keeper and tell the driver where it serves.

        Called before the receiver registers, and with ``restart`` when the keeper
        stopped answering. Raises :class:`BlockStoreError` or :class:`RpcError`.
        """
        keeper = self._local(restart)
        self._tracker.call(m.RegisterBlockKeeper(self.executor_id, self.host, keeper.address))
        with self._lock:
            self._keeper = keeper
        return keeper

    def put(self, name: str, table: pa.Table, generated_ms: int) -> Placed:
        """Put the first copy here and the others elsewhere, in parallel; wait for all.

        Raises :class:`BlockStoreError` when the first copy failed (after starting
        a new local keeper once); a replica that fails only lowers the copies.
        """
        command = json.dumps(
            {"block": name, "generated_ms": generated_ms, "use_disk": self.level.use_disk}
        ).encode()
        wanted = self.level.replication
        # One copy (the common level): no hand-off to a replica thread and back per block.
        replicas = (
            self._pool.submit(self._put_replicas, command, table, wanted - 1)
            if wanted > 1
            else None
        )
        local, local_file = self._put_local(command, table, name, generated_ms)
        placed = replicas.result() if replicas is not None else []
        locations = (local, *placed)
        self._note_copies(len(locations), wanted)
        return Placed(table.get_total_buffer_size(), locations, local_file)

    def remove(self, name: str, locations: Sequence[str]) -> None:
        """Drop the block from every keeper it was put in (best effort, logged)."""
        for address in locations:
            try:
                self._client_of(address).call(m.RemoveBlocks((name,)), self._timeout_s)
            except RpcError:
                log.warning("could not remove block %s from %s", name, address, exc_info=True)

    def held(self) -> KeeperHoldings:
        """What this executor's keeper holds now (every receiver's blocks there); zeros if unknown.

        For the receiver's metrics report (once a report interval): a local call, never raising.
        """
        keeper = self._keeper
        if keeper is None:
            return KeeperHoldings()
        try:
            reply = self._client_of(keeper.address).call(m.DescribeKeeper(), self._timeout_s)
        except RpcError:
            return KeeperHoldings()
        if not isinstance(reply, dict):
            return KeeperHoldings()
        return KeeperHoldings(
            int(reply.get("memory_bytes", 0)),
            int(reply.get("disk_bytes", 0)),
            int(reply.get("blocks", 0)),
        )

    def stopping(self) -> None:
        """The supervisor stops: its last blocks go where they can, no keeper is started.

        The driver releases the keepers when the context stops, maybe while a stopping
        receiver still pushes: a new keeper then would outlive the context.
        """
        self._closing = True

    def close(self) -> None:
        """Stop the replica threads and close the keeper clients."""
        self._closing = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    # --- copies ------------------------------------------------------------------------

    def _put_local(
        self, command: bytes, table: pa.Table, name: str, generated_ms: int
    ) -> tuple[str, str | None]:
        """The first copy's keeper address, and its spool file when the keeper adopted one."""
        keeper = self._keeper or self.start()
        try:
            local_file = self._keep_local(keeper, command, table, name, generated_ms)
        except RpcError as first:
            self._drop_client(keeper.address)
            if self._closing or "was released" in str(first):
                msg = f"could not keep block {name}: the receiver or its context is stopping"
                raise BlockStoreError(msg) from first
            log.warning("the block keeper at %s failed (%s): starting a new one", keeper, first)
        else:
            return keeper.address, local_file
        try:
            keeper = self.start(restart=True)
            local_file = self._keep_local(keeper, command, table, name, generated_ms)
        except (RpcError, BlockStoreError) as e:
            msg = f"could not keep block {name} ({table.num_rows} records) on this executor: {e}"
            raise BlockStoreError(msg) from e
        return keeper.address, local_file

    def _keep_local(
        self, keeper: KeeperHandle, command: bytes, table: pa.Table, name: str, generated_ms: int
    ) -> str | None:
        """The first copy: a file the keeper adopts when it keeps a spool (its path), else a put."""
        client = self._client_of(keeper.address)
        if keeper.spool_dir:
            try:
                path = write_spool_file(keeper.spool_dir, name, table, self._as_parquet(table))
            except OSError as e:  # the spool's disk is full or gone: this block goes by put
                if not self._spool_failed:
                    self._spool_failed = True
                    log.warning(
                        "could not write block %s into the keeper's spool %s (%s): sending "
                        "it by a put (logged once)",
                        name,
                        keeper.spool_dir,
                        e,
                    )
            else:
                adopt = m.AdoptBlock(name, generated_ms, self.level.use_disk, path.name)
                try:
                    client.call(adopt, self._timeout_s)
                except RpcError as e:
                    path.unlink(missing_ok=True)  # not adopted: still ours to delete
                    # A keeper that refused the file may still take the block: a put
                    # decides whether it is gone (and is replaced), not the refusal.
                    log.warning("keeper %s did not adopt block %s (%s): a put", keeper, name, e)
                else:
                    return str(path)
        client.put_table(command, table, self._timeout_s)
        return None

    def _as_parquet(self, table: pa.Table) -> bool:
        """Whether ``table``'s spool file is Parquet (judged once per schema)."""
        if not self._parquet_spool:
            return False
        judged = self._parquet_schema
        if judged is None or not judged[0].equals(table.schema):
            judged = self._parquet_schema = (table.schema, parquet_spool_schema(table.schema))
        return judged[1]

    def _put_replicas(self, command: bytes, table: pa.Table, count: int) -> list[str]:
        placed: list[str] = []
        if count <= 0:
            return placed
        for address in self._replica_targets():
            if len(placed) == count:
                break
            try:
                self._client_of(address).put_table(command, table, self._timeout_s)
                placed.append(address)
            except RpcError as e:
                log.warning("replica of stream %d to %s failed: %s", self.stream_id, address, e)
                self._drop_client(address)
                with self._lock:
                    self._targets_at = None  # ask the driver again for the next block
        return placed

    def _replica_targets(self) -> list[str]:
        now = self._clock.get_time_ms()
        with self._lock:
            fresh = self._targets_at is not None and now - self._targets_at < self._refresh_ms
            if fresh:
                return list(self._targets)
        try:
            reply = self._tracker.call(m.GetReplicaTargets(self.stream_id, self.executor_id))
            targets = [str(t) for t in reply] if isinstance(reply, list) else []
        except RpcError as e:
            log.warning("could not ask the driver for replica targets: %s", e)
            targets = []
        own = self._keeper.address if self._keeper else None
        with self._lock:
            self._targets = [t for t in targets if t != own]
            self._targets_at = now
            return list(self._targets)

    def _note_copies(self, copies: int, wanted: int) -> None:
        with self._lock:
            before, self._copies = self._copies, copies
        if copies == before:
            return
        if copies < wanted:
            message = (
                f"blocks of stream {self.stream_id} ({self.level.name}) are kept on {copies} "
                f"executor(s) instead of {wanted}: no block keeper on another executor "
                "answered; they are replicated again as soon as one does"
            )
            log.warning("%s", message)
        elif before is None:
            message = f"blocks of stream {self.stream_id} are kept on {copies} executor(s)"
        else:
            message = f"blocks of stream {self.stream_id} are replicated again ({copies} copies)"
            log.warning("%s", message)
        try:
            self._tracker.call(m.ReportReplication(self.stream_id, wanted, copies, message))
        except RpcError:
            log.warning("could not report the replication of stream %d", self.stream_id)

    # --- clients -----------------------------------------------------------------------

    def _client_of(self, address: str) -> _Client:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = self._clients[address] = self._client(address)
            return client

    def _drop_client(self, address: str) -> None:
        with self._lock:
            client = self._clients.pop(address, None)
        if client is not None:
            client.close()


_SPOOL_WRITE_BUFFER = 1 << 20
_FALLOC_FL_KEEP_SIZE = 1
_IPC_BYTES_PER_BATCH = 1024
"""Room for a record batch's IPC message header and padding, on top of its buffers."""


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``fallocate(2)`` (``os.posix_fallocate`` cannot keep a file's size), or None."""
    try:
        fallocate = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    return fallocate  # type: ignore[no-any-return]


_fallocate = _load_fallocate()


def _reserve(fd: int, size: int) -> int:
    """``fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, size)``: 0, or the error number."""
    if _fallocate is None:
        return errno.ENOSYS
    return 0 if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, size) == 0 else ctypes.get_errno()


def _preallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes of disk for the empty file ``fd`` without growing it.

    One extent allocation up front instead of a delayed allocation for each page as the
    block is written: on ext4, 64 MiB blocks were written at 36-39 M rows/s instead of
    29-31 M, with 26-27 ns of CPU a row instead of 32-34. A file system that cannot
    (tmpfs), or a system without ``fallocate``, is written as before; a full disk raises
    ``OSError`` here, before a byte is written. The reserve beyond the file's end (the
    estimate's slack) is freed with the file.
    """
    err = _reserve(fd, size)
    if err in (errno.ENOSPC, errno.EDQUOT):
        raise OSError(err, f"no room for a block of {size:,} bytes: {os.strerror(err)}")


def write_spool_file(spool_dir: str, name: str, table: pa.Table, parquet: bool = False) -> Path:
    """Write block ``name`` into a keeper's spool: an Arrow IPC file, or Parquet (uncompressed).

    Parquet (``parquet``; local mode, ``spark.receivers.batch.parquetSpool``) is written
    plain: no compression, no dictionary, no statistics, as Spark's reader reads it at
    least cost (decision 0026). The name is new (a random nonce, created exclusively): a
    keeper's ``AdoptBlock`` keeps it until the block is removed. A file that could not be
    written whole is deleted before raising.
    """
    suffix = PARQUET_SUFFIX if parquet else SPOOL_SUFFIX
    path = Path(spool_dir) / spool_file_name(name, secrets.token_hex(6), suffix)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    batches = max((column.num_chunks for column in table.columns), default=0)
    try:
        try:
            _preallocate(fd, table.nbytes + _IPC_BYTES_PER_BATCH * (batches + 1))
        finally:
            os.close(fd)
        # Buffered: unbuffered, the IPC writer made a write and a seek per Arrow buffer
        # (~300 syscalls for a block of 60,000 lines in 25 chunks). Opened to append, not
        # "wb": truncating the file would free the reserve, and it marks the file, on ext4,
        # for allocation at close (auto_da_alloc, meant for files rewritten in place): each
        # close then started writing the whole block to disk (64 MiB blocks: 17-23 M rows/s
        # instead of 29-35 M), for a file a keeper only maps.
        with (
            pa.OSFile(str(path), "ab") as raw,
            pa.BufferedOutputStream(raw, _SPOOL_WRITE_BUFFER) as sink,
        ):
            if parquet:
                pq.write_table(
                    table,
                    sink,
                    compression="none",
                    use_dictionary=False,
                    write_statistics=False,
                )
            else:
                with pa.ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def keeper_settings(secret: str, host: str, config: StreamingConfig) -> KeeperSettings:
    """How this executor's keeper starts: advertising ``host``, bound and secured per ``config``.

    The same network keys as the receivers' block servers
    (``spark.receivers.executor.bindAddress`` / ``.ports``) and the same TLS.
    """
    from spark_receivers.config_checks import parse_ports

    tls = config.tls
    return KeeperSettings(
        secret=secret,
        host=host,
        watch_pid=0,
        memory_budget_bytes=config.block_store_budget_bytes,
        max_message_bytes=config.max_message_bytes,
        bind_host=config.executor_bind_address or host,
        ports=parse_ports(config.executor_ports, "spark.receivers.executor.ports"),
        spool=config.block_keeper_spool,
        tls_cert_file=tls.cert_file if tls else "",
        tls_key_file=tls.key_file if tls else "",
        tls_ca_file=tls.ca_file if tls else "",
        tls_server_name=(tls.server_name or "") if tls else "",
        tls_client_auth=bool(tls and tls.client_auth),
    )


def keeper_sink(
    stream_id: int,
    executor_id: str,
    host: str,
    secret: str,
    level: StorageLevel,
    tracker: _Caller,
    config: StreamingConfig,
    clock: Clock | None = None,
) -> KeeperSink:
    """A :class:`KeeperSink` for a supervisor, with this executor's keeper and Flight clients."""
    settings = keeper_settings(secret, host, config)

    def local(restart: bool) -> KeeperHandle:
        return ensure_local_keeper(settings, restart=restart)

    return KeeperSink(
        stream_id,
        executor_id,
        host,
        level,
        local,
        tracker,
        lambda address: EndpointClient(address, secret, tls=config.tls),
        config.block_store_timeout_s,
        clock,
        parquet_spool=config.batch_parquet_spool,
    )


LOCAL_EXECUTOR_ID = "driver"
"""Spark's id of the one executor of local mode (the driver's own process)."""
_said_local = threading.Event()


def effective_level(
    level: StorageLevel, config: StreamingConfig, stream_id: int, executor_id: str = ""
) -> StorageLevel:
    """The level a receiver's blocks are kept at: one copy with the receiver WAL on, as Spark.

    Also one copy when block keepers are off (only keepers hold replicas), and in
    local mode (``executor_id`` is Spark's ``driver``: no other executor can ever
    hold a replica), which is said once per process at info level, not as a
    degraded level at every run. The others are logged as warnings.
    """
    level = StorageLevel.of(level, f"the storage level of receiver {stream_id}")
    if level.replication > 1 and executor_id == LOCAL_EXECUTOR_ID:
        if not _said_local.is_set():
            _said_local.set()
            log.info(
                "local mode has one executor: receivers keep 1 copy of their blocks (%s asks "
                "for %d; a cluster's second executor would hold the other)",
                level.name,
                level.replication,
            )
        return level.with_replication(1)
    if level.replication > 1 and config.receiver_wal_enabled:
        log.warning(
            "Storage level replication %d is unnecessary when the receiver write-ahead log is "
            "enabled: receiver %d keeps 1 copy (%s)",
            level.replication,
            stream_id,
            level.with_replication(1).name,
        )
        return level.with_replication(1)
    if level.replication > 1 and not config.block_keeper_enabled:
        log.warning(
            "receiver %d keeps 1 copy of its blocks instead of %d: replicas need block keepers "
            "(spark.receivers.blockKeeper.enabled=false)",
            stream_id,
            level.replication,
        )
        return level.with_replication(1)
    return level
