"""RecordHandle serialization and confine_handle."""

from __future__ import annotations

import json
import os

import pytest

from spark_receivers.errors import WriteAheadLogError
from spark_receivers.wal import RecordHandle, confine_handle


def test_round_trip_through_json() -> None:
    handle = RecordHandle("/ckpt/wal/log-0-60000", 12, 34)
    assert RecordHandle.from_dict(json.loads(json.dumps(handle.to_dict()))) == handle


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"offset": 0, "length": 1}, "'path' is missing"),
        ({"path": "/a", "length": 1}, "'offset' is missing"),
        ({"path": 5, "offset": 0, "length": 1}, "'path' must be a non-empty string"),
        ({"path": "", "offset": 0, "length": 1}, "'path' must be a non-empty string"),
        ({"path": "/a", "offset": "0", "length": 1}, "'offset' must be an int, got str"),
        ({"path": "/a", "offset": True, "length": 1}, "'offset' must be an int, got bool"),
        ({"path": "/a", "offset": 0, "length": 1.0}, "'length' must be an int, got float"),
        ({"path": "/a", "offset": -1, "length": 1}, "'offset' must be >= 0, got -1"),
        ({"path": "/a", "offset": 0, "length": -2}, "'length' must be >= 0, got -2"),
    ],
)
def test_from_dict_validates_and_names_the_field(data: dict, field: str) -> None:
    with pytest.raises(WriteAheadLogError, match=field):
        RecordHandle.from_dict(data)


def test_from_dict_refuses_a_non_mapping() -> None:
    with pytest.raises(WriteAheadLogError, match="must be a mapping, got list"):
        RecordHandle.from_dict([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "path",
    [
        "/ckpt/wal/log-0-1",
        "/ckpt/wal/sub/log-0-1",
        "/ckpt/wal//log-0-1",
        "/ckpt/wal/./log-0-1",
        "file:///ckpt/wal/log-0-1",
    ],
)
def test_confine_accepts_paths_inside(path: str) -> None:
    handle = RecordHandle(path, 0, 1)
    assert confine_handle(handle, "/ckpt/wal") is handle
    assert confine_handle(handle, "/ckpt/wal/") is handle


@pytest.mark.parametrize(
    "path",
    [
        "/ckpt/wal/../other/log-0-1",
        "/ckpt/wal/sub/../../etc/passwd",
        "/ckpt/wal",
        "/ckpt/wal2/log-0-1",
        "/etc/passwd",
        "ckpt/wal/log-0-1",
        "/ckpt/wal/log\x00-0-1",
        "/ckpt/wal/..\\..\\x",
    ],
)
def test_confine_refuses_paths_outside(path: str) -> None:
    with pytest.raises(WriteAheadLogError, match=r"refused|not inside"):
        confine_handle(RecordHandle(path, 0, 1), "/ckpt/wal")


def test_confine_relative_object_store_paths() -> None:
    assert confine_handle(RecordHandle("bucket/wal/log-1-2", 0, 1), "bucket/wal")
    with pytest.raises(WriteAheadLogError):
        confine_handle(RecordHandle("bucket/other/log-1-2", 0, 1), "bucket/wal")


def test_confine_resolves_symlinks_when_asked(tmp_path: object) -> None:
    root = os.path.join(str(tmp_path), "wal")
    outside = os.path.join(str(tmp_path), "outside")
    os.makedirs(root)
    os.makedirs(outside)
    os.symlink(outside, os.path.join(root, "link"))
    handle = RecordHandle(os.path.join(root, "link", "log-0-1"), 0, 1)
    assert confine_handle(handle, root)  # lexically inside
    with pytest.raises(WriteAheadLogError, match="not inside"):
        confine_handle(handle, root, resolve_symlinks=True)
