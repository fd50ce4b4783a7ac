"""Shared helpers for the write-ahead log tests (imported by the test modules)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from spark_receivers.wal import BatchedWriteAheadLog, FileBasedWriteAheadLog, WriteAheadLog

ROLLING_S = 1  # with writes every 500 ms, two records per segment
STEP_MS = 500


@dataclass(frozen=True)
class LogKind:
    """One of the four flavours Spark's WriteAheadLogSuite runs every scenario against."""

    batched: bool
    close_after_write: bool

    @property
    def id(self) -> str:
        base = "batched" if self.batched else "file"
        return f"{base}-{'close' if self.close_after_write else 'append'}"


KINDS = [LogKind(b, c) for b in (False, True) for c in (False, True)]


def make_log(kind: LogKind, log_dir: str, **kwargs: Any) -> WriteAheadLog:
    kwargs.setdefault("rolling_interval_s", ROLLING_S)
    file_log = FileBasedWriteAheadLog(
        log_dir, close_file_after_write=kind.close_after_write, **kwargs
    )
    if kind.batched:
        return BatchedWriteAheadLog(file_log, batching_timeout_s=10.0)
    return file_log


@pytest.fixture(params=KINDS, ids=lambda k: k.id)
def kind(request: pytest.FixtureRequest) -> LogKind:
    return request.param


@pytest.fixture
def log_dir(tmp_path: Any) -> str:
    return str(tmp_path / "wal")


def generate_data(n: int = 20, seed: int = 7) -> list[bytes]:
    rnd = random.Random(seed)
    return [f"record-{i}-".encode() + rnd.randbytes(rnd.randint(0, 64)) for i in range(n)]


def write_data(
    log: WriteAheadLog, data: list[bytes], start_ms: int = 0, step_ms: int = STEP_MS
) -> list[Any]:
    """Write ``data`` one record per time step (Spark's writeDataUsingWriteAheadLog)."""
    return [log.write(item, start_ms + i * step_ms) for i, item in enumerate(data)]


def write_and_close(
    kind: LogKind, log_dir: str, data: list[bytes], start_ms: int = 0, **kwargs: Any
) -> list[Any]:
    log = make_log(kind, log_dir, **kwargs)
    try:
        return write_data(log, data, start_ms)
    finally:
        log.close()


def read_all(kind: LogKind, log_dir: str, **kwargs: Any) -> list[bytes]:
    log = make_log(kind, log_dir, **kwargs)
    try:
        return list(log.read_all())
    finally:
        log.close()


def segment_files(log_dir: str) -> list[str]:
    if not os.path.isdir(log_dir):
        return []
    names = [n for n in os.listdir(log_dir) if n.startswith("log-")]

    def key(name: str) -> tuple[int, ...]:
        base, _, seq = name.partition(".")
        _, start, end = base.split("-")
        return (int(start), int(end), int(seq or 0))

    return [os.path.join(log_dir, n) for n in sorted(names, key=key)]


TruncateFn = Callable[[str, int], None]


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)
