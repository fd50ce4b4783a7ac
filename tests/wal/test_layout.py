"""CheckpointLayout: every path under a checkpoint directory, and resolving it."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from spark_receivers.driver.batches.checkpoint import CheckpointStore
from spark_receivers.errors import CheckpointError, WriteAheadLogError
from spark_receivers.wal import FileBasedWriteAheadLog, RecordHandle
from spark_receivers.wal.block_records import decode_block, encode_block, read_block_from_wal
from spark_receivers.wal.layout import CheckpointLayout, resolve_filesystem


def test_local_paths(tmp_path):
    layout = CheckpointLayout(str(tmp_path) + "/")
    root = str(tmp_path)
    assert layout.is_local and isinstance(layout.filesystem, pafs.LocalFileSystem)
    assert layout.root == root
    assert layout.checkpoint_file == os.path.join(root, "checkpoint.json")
    assert layout.driver_wal_dir == os.path.join(root, "receivedBlockMetadata")
    assert layout.received_data_dir == os.path.join(root, "receivedData")
    assert layout.receiver_wal_dir(3) == os.path.join(root, "receivedData", "3")
    tmp = layout.checkpoint_temp_file()
    assert os.path.dirname(tmp) == root and os.path.basename(tmp).startswith(".checkpoint.json.")
    assert tmp != layout.checkpoint_temp_file()
    assert layout.corrupt_checkpoint_file().startswith(layout.checkpoint_file + ".corrupt-")
    assert not os.listdir(tmp_path)  # nothing is created


def test_relative_paths_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert CheckpointLayout("ckpt").root == os.path.join(str(tmp_path), "ckpt")


def test_a_file_uri_resolves_to_the_local_filesystem(tmp_path):
    layout = CheckpointLayout(f"file://{tmp_path}")
    assert layout.is_local
    assert layout.receiver_wal_dir(0) == os.path.join(str(tmp_path), "receivedData", "0")


def test_paths_join_on_the_resolved_path_not_on_a_uri_query():
    uri = "s3://key:secret@bucket/ckpt?endpoint_override=127.0.0.1:9&scheme=http"
    layout = CheckpointLayout(uri)
    assert not layout.is_local
    assert layout.root == "bucket/ckpt"
    assert layout.driver_wal_dir == "bucket/ckpt/receivedBlockMetadata"
    assert layout.receiver_wal_dir(1) == "bucket/ckpt/receivedData/1"


def test_a_given_filesystem_takes_the_directory_as_a_path_on_it():
    fs = pafs.LocalFileSystem()
    layout = CheckpointLayout("/ckpt", filesystem=fs)
    assert layout.filesystem is fs and layout.driver_wal_dir == "/ckpt/receivedBlockMetadata"


def test_unresolvable_locations_raise_naming_them():
    with pytest.raises(WriteAheadLogError, match=r"checkpoint directory 'nope://x'") as info:
        CheckpointLayout("nope://x")
    assert isinstance(info.value.__cause__, pa.ArrowInvalid)
    with pytest.raises(WriteAheadLogError, match="non-empty"):
        CheckpointLayout("")
    with pytest.raises(WriteAheadLogError, match="WAL directory"):
        resolve_filesystem("nope://x", "WAL directory")
    with pytest.raises(WriteAheadLogError, match="cannot resolve the WAL directory"):
        FileBasedWriteAheadLog("nope://x")
    with pytest.raises(CheckpointError, match="nope://x"):
        CheckpointStore("nope://x")


def test_bad_stream_ids_are_refused():
    layout = CheckpointLayout("/ckpt")
    for bad in (-1, True, "0", 1.0):
        with pytest.raises(WriteAheadLogError, match="stream_id"):
            layout.receiver_wal_dir(bad)  # type: ignore[arg-type]


def test_confine_receiver_handle():
    layout = CheckpointLayout("/ckpt")
    good = RecordHandle("/ckpt/receivedData/2/log-0-1", 0, 5)
    assert layout.confine_receiver_handle(good, 2) is good
    assert layout.confine_receiver_handle(good.to_dict(), 2) == good
    for path in (
        "/ckpt/receivedData/1/log-0-1",  # another stream
        "/ckpt/receivedData/20/log-0-1",  # a prefix of the name is not enough
        "/ckpt/receivedBlockMetadata/log-0-1",
        "/ckpt/receivedData/2",  # the directory itself
        "/elsewhere/log-0-1",
        "receivedData/2/log-0-1",  # relative
    ):
        with pytest.raises(WriteAheadLogError, match="not inside"):
            layout.confine_receiver_handle(RecordHandle(path, 0, 5), 2)
    with pytest.raises(WriteAheadLogError, match=r"'\.\.'"):
        layout.confine_receiver_handle(RecordHandle("/ckpt/receivedData/2/../1/x", 0, 5), 2)
    with pytest.raises(WriteAheadLogError, match="'offset' is missing"):
        layout.confine_receiver_handle({"path": good.path, "length": 5}, 2)


def test_confine_on_an_object_store_compares_paths_on_it():
    layout = CheckpointLayout("s3://key:secret@bucket/ckpt?endpoint_override=127.0.0.1:9")
    handle = RecordHandle("bucket/ckpt/receivedData/0/log-0-1", 0, 5)
    assert layout.confine_receiver_handle(handle, 0) is handle
    with pytest.raises(WriteAheadLogError, match="not inside"):
        layout.confine_receiver_handle(RecordHandle("other/ckpt/receivedData/0/x", 0, 5), 0)


def test_block_records_round_trip_through_the_receiver_wal(tmp_path):
    layout = CheckpointLayout(str(tmp_path))
    table = pa.table({"value": ["a", "b"], "n": [1, 2]})
    wal = FileBasedWriteAheadLog(layout.receiver_wal_dir(0), filesystem=layout.filesystem)
    handle = wal.write(encode_block(table), 1_000)
    wal.close()
    assert read_block_from_wal(layout, 0, handle.to_dict()) == table
    assert read_block_from_wal(str(tmp_path), 0, handle.to_dict()) == table
    with pytest.raises(WriteAheadLogError, match="not inside"):
        read_block_from_wal(layout, 1, handle.to_dict())
    assert decode_block(bytes(encode_block(table))) == table
