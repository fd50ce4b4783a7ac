"""What reached the sink: the ``parquet:DIR`` output of ``ingest``, one directory per batch.

A batch's directory ``DIR/batch_time_ms=<t>`` counts once Spark wrote its
``_SUCCESS`` marker; a batch run again overwrites its own directory, so reading
every complete directory counts each delivered record once per block it was in.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

PREFIX = "batch_time_ms="


class SinkWatch:
    """The complete batch directories of a parquet sink, polled cheaply (new names only)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._complete: set[int] = set()
        self._lock = threading.Lock()

    def poll(self) -> int:
        """Note batches completed since the last poll; return the newest batch time (0: none)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        with self._lock:
            for name in names:
                if not name.startswith(PREFIX):
                    continue
                t = int(name[len(PREFIX) :])
                if t not in self._complete and (self.directory / name / "_SUCCESS").exists():
                    self._complete.add(t)
            return max(self._complete, default=0)

    def complete(self) -> set[int]:
        self.poll()
        with self._lock:
            return set(self._complete)

    def incomplete(self) -> list[int]:
        """Batch directories without ``_SUCCESS`` (a batch whose write never finished)."""
        done = self.complete()
        names = os.listdir(self.directory) if self.directory.exists() else []
        return sorted(
            t
            for t in (int(n[len(PREFIX) :]) for n in names if n.startswith(PREFIX))
            if t not in done
        )

    def counts(self, sent: int) -> np.ndarray:
        """How often each record ``0..sent-1`` is in a complete batch (records beyond: ignored)."""
        counts = np.zeros(sent, dtype=np.int32)
        for t in sorted(self.complete()):
            for f in sorted((self.directory / f"{PREFIX}{t}").glob("*.parquet")):
                values = pc.cast(pq.read_table(f, columns=["value"]).column("value"), "int64")
                v = values.to_numpy(zero_copy_only=False)
                inside = v[(v >= 0) & (v < sent)]
                counts += np.bincount(inside, minlength=sent).astype(np.int32)
                if len(inside) != len(v):
                    raise AssertionError(f"{f}: {len(v) - len(inside)} values never sent")
        return counts
