"""A keeper's spool: the block files a receiver, its keeper and the batch reads of one host share.

A keeper that keeps a spool (``spark.receivers.blockKeeper.spool``, the default) makes a
private directory (mode 0700) under its spill directory or the system's temporary one. A
receiver on the same host writes a block's first copy there as an Arrow IPC file
(``<block id>.<nonce>.arrow``) and hands it over (``AdoptBlock``); the keeper maps it and keeps
the file until the driver removes the block (``RemoveBlocks``), so a batch's read task on
the same host maps the same file (:func:`read_spooled`) instead of fetching the block from
the keeper over Arrow Flight: the block is written once and read in place (issue 31, item 4;
decision 0011). A reader on another host, or one that finds no file, fetches as before.

In local mode with ``spark.receivers.batch.parquetSpool`` on (off by default; decision
0026) the file is Parquet instead (``<block id>.<nonce>.parquet``, written only for a schema
Spark reads back as it is: :func:`parquet_spool_schema`): the batch is then read by Spark's
own Parquet reader, with no Python read task, and the keeper reads only the file's footer
when it adopts it.

**Alive, or gone with its keeper**: the keeper holds an exclusive ``flock`` on the spool's
``.alive`` file as long as it runs; the kernel drops it when the process ends, however it
ends. A reader maps a block's file only while that lock is held, so a block lives as long
as its keeper, as a block fetched over Flight does (a keeper killed with its executor loses
its blocks; replicas and the WAL are what survive it). A keeper starting on the host
removes the spools of keepers that are gone (:func:`sweep_dead_spools`); a keeper's own
files that no receiver handed over are swept after ``SPOOL_ORPHAN_S``.

Plain functions; executor side (keeper, receiver task, read task).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

__all__ = [
    "ALIVE_FILE",
    "PARQUET_SUFFIX",
    "SPOOL_ORPHAN_S",
    "SPOOL_PREFIX",
    "SPOOL_SUFFIX",
    "NotOurFileError",
    "close_quietly",
    "is_our_file",
    "is_spool_file",
    "make_spool",
    "map_spool_file",
    "parquet_spool_schema",
    "read_block_file",
    "read_spooled",
    "spool_alive",
    "spool_file_name",
    "spool_file_rows",
    "sweep_dead_spools",
]

SPOOL_ORPHAN_S = 120.0
"""A spool file older than this that its keeper does not hold was never handed over (a
receiver writes and hands over a block within its put timeout): swept."""
SPOOL_PREFIX = "block-spool-"
SPOOL_SUFFIX = ".arrow"
PARQUET_SUFFIX = ".parquet"
"""The suffix of a spool file written as Parquet (local mode, ``batch.parquetSpool``)."""
ALIVE_FILE = ".alive"
DEAD_SPOOL_MIN_AGE_S = 60.0
"""A spool without a live keeper is removed only when at least this old: a keeper that is
starting makes its directory, then takes the lock a moment later."""


class NotOurFileError(OSError):
    """A spool path that is not a regular file of this user (a link, a directory...)."""


def is_our_file(path: str) -> bool:
    """Whether ``path`` is a regular file of this user (a link is refused, not followed)."""
    try:
        _check_ours(path)
    except OSError:
        return False
    return True


def _check_ours(path: str) -> None:
    """Raise :class:`NotOurFileError` unless ``path`` is a regular file of this user.

    Judged from its ``lstat``: a link is refused, not followed.
    """
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        msg = f"{os.path.basename(path)} is not a regular file of ours"
        raise NotOurFileError(msg)


def read_block_file(path: str) -> pa.Table:
    """The table of a block file: an Arrow IPC file mapped (no copy), or Parquet decoded.

    Told apart by the suffix (:data:`PARQUET_SUFFIX`); raises ``OSError`` or
    ``pyarrow.ArrowInvalid`` when the file cannot be read.
    """
    if path.endswith(PARQUET_SUFFIX):
        return pq.read_table(path, memory_map=True)
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all()


def map_spool_file(path: str) -> pa.Table:
    """The table of the spool file at ``path`` (an Arrow IPC file: mapped, no copy).

    The keeper's adopt and the readers' map both come here. Raises
    :class:`NotOurFileError` when ``path`` is not a regular file of this user (judged from
    its ``lstat``: a link is refused, not followed), else ``OSError`` or
    ``pyarrow.ArrowInvalid`` when it cannot be read.
    """
    _check_ours(path)
    return read_block_file(path)


def spool_file_rows(path: str) -> tuple[int, int]:
    """The rows and bytes of the Parquet spool file at ``path``, from its footer alone.

    What a keeper adopting a Parquet block reads (it decodes the block only to serve it
    over Flight). Raises as :func:`map_spool_file`.
    """
    _check_ours(path)
    meta = pq.read_metadata(path)
    return meta.num_rows, os.stat(path).st_size


_SPARK_PARQUET_LEAVES = (
    pa.types.is_boolean,
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_date32,
    pa.types.is_decimal128,
)


def _spark_reads_back(t: pa.DataType) -> bool:
    if pa.types.is_unsigned_integer(t) or pa.types.is_float16(t):
        return False
    if pa.types.is_timestamp(t):
        return t.unit != "ns"  # Spark refuses TIMESTAMP(NANOS); s is written as ms
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _spark_reads_back(t.value_type)
    if pa.types.is_map(t):
        return _spark_reads_back(t.key_type) and _spark_reads_back(t.item_type)
    if pa.types.is_struct(t):
        return _names_apart([t.field(i).name for i in range(t.num_fields)]) and all(
            _spark_reads_back(t.field(i).type) for i in range(t.num_fields)
        )
    return any(check(t) for check in _SPARK_PARQUET_LEAVES)


def _names_apart(names: list[str]) -> bool:
    """No two names equal but for case (Spark matches Parquet columns without case)."""
    return len({n.lower() for n in names}) == len(names)


def parquet_spool_schema(schema: pa.Schema) -> bool:
    """Whether blocks of ``schema`` may be spooled as Parquet for Spark's reader.

    Only types Spark's Parquet reader gives back as the batch's own Spark types
    (booleans, signed integers, floats, strings, binary, dates, decimals, timestamps
    but in nanoseconds, and lists, maps and structs of them) and names that differ
    other than by case; blocks of any other schema stay Arrow IPC files.
    """
    return _names_apart(schema.names) and all(_spark_reads_back(f.type) for f in schema)


def spool_file_name(block_id: str, nonce: str, suffix: str = SPOOL_SUFFIX) -> str:
    """The name a receiver gives the spool file of ``block_id`` (``nonce``: its own, unique)."""
    return f"{block_id}.{nonce}{suffix}"


def is_spool_file(name: str, block_id: str) -> bool:
    """Whether ``name`` is a bare spool file name for ``block_id`` (either format)."""
    return (
        os.path.basename(name) == name
        and name.startswith(block_id + ".")
        and (name.endswith(SPOOL_SUFFIX) or name.endswith(PARQUET_SUFFIX))
    )


def make_spool(parent: str) -> tuple[str, int]:
    """A new private spool under ``parent`` and the descriptor holding its ``.alive`` lock.

    The lock is the keeper's for as long as the descriptor is open (keep it for the
    process's life). ``("", -1)`` when no spool can be made there (logged: blocks then
    come by ``do_put``).
    """
    try:
        spool = tempfile.mkdtemp(prefix=SPOOL_PREFIX, dir=parent)  # mode 0o700
    except OSError as e:
        log.warning("no block spool under %s (%s): blocks come by do_put", parent, e)
        return "", -1
    try:
        fd = os.open(os.path.join(spool, ALIVE_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        log.warning("no block spool under %s (its lock: %s): blocks come by do_put", parent, e)
        shutil.rmtree(spool, ignore_errors=True)
        return "", -1
    return spool, fd


def spool_alive(spool: str) -> bool:
    """Whether the keeper of ``spool`` still runs (it holds the ``.alive`` lock)."""
    try:
        fd = os.open(os.path.join(spool, ALIVE_FILE), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # held: the keeper runs
    except OSError:
        return False
    else:
        return False  # nobody holds it: the keeper is gone
    finally:
        os.close(fd)  # closing drops a lock this probe took


def sweep_dead_spools(parent: str, keep: str = "", min_age_s: float = DEAD_SPOOL_MIN_AGE_S) -> int:
    """Remove the spools under ``parent`` whose keeper is gone; return how many.

    ``keep`` (the caller's own spool) is never touched, nor a spool younger than
    ``min_age_s`` (its keeper may be taking its lock) or one that is not ours.
    """
    removed = 0
    cutoff = time.time() - min_age_s
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(SPOOL_PREFIX) or entry.path == keep:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_ctime > cutoff:
            continue
        if not spool_alive(entry.path):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    if removed:
        log.warning("removed %d block spool(s) of keepers that are gone under %s", removed, parent)
    return removed


def read_spooled(path: str, block_id: str, num_records: int) -> pa.Table | None:
    """Block ``block_id`` mapped from its spool file, or None when it cannot be read here.

    None (the caller fetches the block from a keeper) when the file is not on this host,
    its keeper is gone, it is not a regular file of ours named for the block, or it does
    not hold ``num_records`` records. The table of an Arrow IPC file maps the file: it stays
    readable after the keeper removes the block (the pages go with the last mapping); a
    Parquet file is decoded.
    """
    if not is_spool_file(os.path.basename(path), block_id):
        return None
    if not spool_alive(os.path.dirname(path)):
        return None
    try:
        table = map_spool_file(path)
    except (OSError, pa.ArrowInvalid) as e:
        log.debug("block %s: its spool file %s could not be read here (%s)", block_id, path, e)
        return None
    if table.num_rows != num_records:
        log.warning(
            "block %s: its spool file %s holds %d records, not %d: fetched instead",
            block_id,
            path,
            table.num_rows,
            num_records,
        )
        return None
    return table


def close_quietly(fd: int) -> None:
    """Close a spool's lock descriptor (``-1``: none)."""
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
