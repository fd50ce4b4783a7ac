"""Fetching one block: from a block store holding a copy, else from the receiver WAL.

Runs in the Python worker of a batch read task. A block whose first copy is a file in
its keeper's spool on this host is mapped from that file while the keeper lives
(``receiver/block_spool.py``): no Flight call, no copy. Otherwise the block stores holding its
copies are tried in turn (those on this host first, then in the order the block
names them); when none can serve it (their executors are gone, or the block was
recovered after a driver restart and is known to be in no store) the block's
write-ahead log record is read from ``<checkpoint_dir>/receivedData`` on the
checkpoint's filesystem. A block that is in none of them raises
:class:`~spark_receivers.errors.BlockNotFoundError` whose message names it and
starts with :data:`LOST_BLOCK_MARKER`, so the driver can report the loss.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections import OrderedDict

import pyarrow as pa

from spark_receivers.errors import BlockNotFoundError, BlockStoreError, RpcError, WriteAheadLogError
from spark_receivers.receiver.block_spool import read_spooled
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.rpc.tls import TlsConfig
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.wal.layout import CheckpointLayout

log = logging.getLogger(__name__)

LOST_BLOCK_MARKER = "lost block"
LOST_BLOCK_RE = re.compile(r"lost block (input-\d+-\d+-\d+) of stream (\d+) \((\d+) records\)")
"""Finds the lost blocks named in an error text (which Spark may wrap several times)."""


_MAX_CLIENTS = 16
_clients: OrderedDict[tuple[str, str, TlsConfig | None], EndpointClient] = OrderedDict()
_clients_lock = threading.Lock()


def _client(endpoint: str, secret: str, tls: TlsConfig | None = None) -> EndpointClient:
    """A Flight client for ``endpoint``, kept for the next blocks (Python workers are reused)."""
    key = (endpoint, secret, tls)
    with _clients_lock:
        client = _clients.pop(key, None) or EndpointClient(endpoint, secret, tls=tls)
        _clients[key] = client
        while len(_clients) > _MAX_CLIENTS:
            _, oldest = _clients.popitem(last=False)
            oldest.close()
    return client


def _drop_client(endpoint: str, secret: str, tls: TlsConfig | None = None) -> None:
    with _clients_lock:
        client = _clients.pop((endpoint, secret, tls), None)
    if client is not None:
        client.close()


@functools.lru_cache(maxsize=8)
def _layout(checkpoint_dir: str) -> CheckpointLayout:
    """The layout of ``checkpoint_dir``, resolved once per worker (a URI builds a client)."""
    return CheckpointLayout(checkpoint_dir)


def fetch_block(
    info: ReceivedBlockInfo,
    secret: str,
    timeout_s: float = 60.0,
    checkpoint_dir: str | None = None,
    tls: TlsConfig | None = None,
) -> pa.Table:
    """Return a block's data from its store or, failing that, from its WAL record.

    Raises :class:`BlockNotFoundError` naming the block (and both causes) when it
    is in neither.
    """
    if info.local_file is not None:
        table = read_spooled(info.local_file, info.block_id, info.num_records)
        if table is not None:
            return table
    errors: list[str] = []
    for endpoint in nearest_first(info.locations):
        client = _client(endpoint, secret, tls)
        try:
            return client.read_table(info.block_id.encode(), timeout_s)
        except RpcError as e:
            errors.append(f"{endpoint}: {e}")
            _drop_client(endpoint, secret, tls)
    store_error = "; ".join(errors) or None
    where = (
        f"its block store(s) at {', '.join(info.locations)}" if info.locations else "no block store"
    )
    if errors:
        log.warning("block %s is in none of its block stores (%s)", info.block_id, store_error)
    if info.wal_handle is not None and checkpoint_dir:
        from spark_receivers.wal.block_records import read_block_from_wal

        try:
            table = read_block_from_wal(_layout(checkpoint_dir), info.stream_id, info.wal_handle)
        except (WriteAheadLogError, BlockStoreError) as e:
            msg = (
                f"{LOST_BLOCK_MARKER} {info.block_id} of stream {info.stream_id} "
                f"({info.num_records} records): not in {where} ({store_error}) and its "
                f"write-ahead log record {info.wal_handle} could not be read: {e}"
            )
            raise BlockNotFoundError(msg) from e
        if table.num_rows != info.num_records:
            msg = (
                f"{LOST_BLOCK_MARKER} {info.block_id} of stream {info.stream_id} "
                f"({info.num_records} records): its write-ahead log record holds "
                f"{table.num_rows} records"
            )
            raise BlockNotFoundError(msg)
        log.info("block %s read from the receiver WAL (%s)", info.block_id, store_error)
        return table
    if info.wal_handle is not None:
        hint = "it has a write-ahead log record but the batch reader got no checkpoint_dir"
    else:
        hint = (
            "it has no write-ahead log record; keep blocks on two executors (storage "
            "level MEMORY_AND_DISK_2, the default, with block keepers on) or enable "
            "receiver_wal_enabled with a checkpoint_dir to survive the loss of an executor"
        )
    msg = (
        f"{LOST_BLOCK_MARKER} {info.block_id} of stream {info.stream_id} "
        f"({info.num_records} records) could not be read: it is in {where} "
        f"({store_error}); {hint}"
    )
    raise BlockNotFoundError(msg)


def report_lost_block(
    tracker: str | None,
    secret: str,
    info: ReceivedBlockInfo,
    reason: str,
    tls: TlsConfig | None = None,
) -> None:
    """Tell the driver a read left ``info`` out (``lostBlockPolicy=skip``); logged, never raises."""
    log.error("skipping lost block %s (%d records): %s", info.block_id, info.num_records, reason)
    if not tracker:
        return
    from spark_receivers.rpc.messages import ReportLostBlock

    try:
        _client(tracker, secret, tls).call(
            ReportLostBlock(info.stream_id, info.block_id, info.num_records, reason[:2000]),
            timeout_s=30.0,
        )
    except RpcError:
        log.warning("could not report lost block %s to the driver", info.block_id, exc_info=True)


def nearest_first(locations: tuple[str, ...]) -> list[str]:
    """``locations`` with those on this host first (a loopback read), the order kept otherwise."""
    if len(locations) < 2:
        return list(locations)
    here = _local_host()
    return sorted(locations, key=lambda loc: loc.rsplit(":", 1)[0] != here)


@functools.cache
def _local_host() -> str:
    from spark_receivers.rpc.hosts import local_host

    return local_host()


def lost_blocks_in(error: BaseException) -> list[tuple[str, int, int, str]]:
    """The blocks a failed batch could not read: ``(block id, stream id, records, reason)``.

    Spark wraps the reader's :class:`BlockNotFoundError` (maybe several times), so the
    blocks are found by :data:`LOST_BLOCK_RE` in the text of the error and its causes;
    each block once, in the order met.
    """
    texts: list[str] = []
    cause: BaseException | None = error
    while cause is not None and len(texts) < 10:
        texts.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    found: dict[str, tuple[str, int, int, str]] = {}
    text = "\n".join(texts)
    for match in LOST_BLOCK_RE.finditer(text):
        block_id = match.group(1)
        if block_id not in found:
            end = text.find("\n", match.start())
            reason = text[match.start() : end if end >= 0 else None]
            found[block_id] = (block_id, int(match.group(2)), int(match.group(3)), reason)
    return list(found.values())
