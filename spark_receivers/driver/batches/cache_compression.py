"""The batch cache's compression: off for the batch's own cache, and only there (decision 0011).

A batch's cached rows live for one batch; finding a compression for each column of each
batch cost its first action more than the memory it saved. Spark reads
``spark.sql.inMemoryColumnarStorage.compressed`` from the session's conf when a cache's
column batches are defined: :func:`persist_uncompressed` turns it off for that moment on a
classic session; on Spark Connect, where the batches are defined by the batch's first
action on the server, :class:`ConnectCacheSetting` holds it off in the session while a
context reads cached batches through it: the user's own caches in that session are
uncompressed then too, unless the user set the key on the session, which then decides for
both (docs/deploy.md). Used by the batch reader (``batch_reader.py``).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

__all__ = [
    "COMPRESSED_KEY",
    "CONNECT_CACHE_SETTING",
    "ConnectCacheSetting",
    "persist_uncompressed",
]

COMPRESSED_KEY = "spark.sql.inMemoryColumnarStorage.compressed"
_conf_lock = threading.Lock()
_fallback_logged = threading.Event()


def persist_uncompressed(spark: SparkSession, df: DataFrame) -> DataFrame:
    """``df`` persisted (``MEMORY_ONLY``) with its column batches left uncompressed.

    Spark reads the compression setting when the cache's column batches are defined (the
    first use of the cached relation), from the session's conf: the batches are defined
    here, with the setting off for that moment, and the setting is put back. Where that
    Spark internal is not there (another Spark, Spark Connect), the DataFrame is persisted
    as the session's setting says, and it is logged once.
    """
    from pyspark import StorageLevel

    conf = spark.conf
    with _conf_lock:
        before = conf.get(COMPRESSED_KEY, None)
        conf.set(COMPRESSED_KEY, "false")
        try:
            df = df.persist(StorageLevel.MEMORY_ONLY)
            try:
                jdf = df._jdf
                cached = spark._jsparkSession.sharedState().cacheManager().lookupCachedData(jdf)
                cached.get().cachedRepresentation().cacheBuilder().cachedColumnBuffers()
            except Exception as e:  # noqa: BLE001 - the batch still gets a (compressed) cache
                if not _fallback_logged.is_set():
                    _fallback_logged.set()
                    log.warning(
                        "the batch cache is compressed as the session says (could not define "
                        "it uncompressed: %s); see docs/decisions/0011",
                        e,
                    )
        finally:
            if before is None:
                conf.unset(COMPRESSED_KEY)
            else:
                conf.set(COMPRESSED_KEY, before)
    return df


class ConnectCacheSetting:
    """Batch caches uncompressed on a Spark Connect session, for as long as a context reads.

    Spark reads ``spark.sql.inMemoryColumnarStorage.compressed`` from the session's conf
    when a cache's column batches are built, which on Connect is the batch's first action,
    run by the user's function through the server: the key must be off in the session then.
    :meth:`hold` turns it off when the first context that caches on the session needs it
    and the user has not set it; :meth:`release` by the last of them puts it back (unset).
    A value the user set (``true`` or ``false``) is left alone: the batch caches follow it.
    One instance per process; contexts on one session share its count.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: dict[int, int] = {}
        """id(session) → contexts holding the setting off (only sessions we turned it off in)."""
        self._left_alone: set[int] = set()

    def hold(self, spark: SparkSession) -> bool:
        """Turn the setting off for ``spark`` (if the user did not set it); True if held."""
        key = id(spark)
        with self._lock:
            if key in self._holders:
                self._holders[key] += 1
                return True
            before = spark.conf.get(COMPRESSED_KEY, None)
            if before is not None:
                if key not in self._left_alone:
                    self._left_alone.add(key)
                    log.info(
                        "Spark Connect: batch caches follow the session's %s=%s (set by you)",
                        COMPRESSED_KEY,
                        before,
                    )
                return False
            spark.conf.set(COMPRESSED_KEY, "false")
            self._holders[key] = 1
        log.info(
            "Spark Connect: %s=false in this session while the streaming context runs, so "
            "that batch caches are uncompressed (decision 0011); your own caches in this "
            "session are uncompressed too meanwhile: set the key to keep them compressed",
            COMPRESSED_KEY,
        )
        return True

    def release(self, spark: SparkSession) -> None:
        """A context that held the setting stopped: the last one unsets it."""
        key = id(spark)
        with self._lock:
            left = self._holders.get(key, 0) - 1
            if left > 0:
                self._holders[key] = left
                return
            self._holders.pop(key, None)
            try:
                if spark.conf.get(COMPRESSED_KEY, None) == "false":  # not changed since
                    spark.conf.unset(COMPRESSED_KEY)
            except Exception:  # the session may be stopping: the setting goes with it
                log.debug("could not put back %s", COMPRESSED_KEY, exc_info=True)


CONNECT_CACHE_SETTING = ConnectCacheSetting()
