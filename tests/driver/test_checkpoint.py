"""CheckpointStore on the paths of its CheckpointLayout (local and object-store branches)."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from spark_receivers.driver.batches.checkpoint import Checkpoint, CheckpointStore
from spark_receivers.errors import CheckpointError
from spark_receivers.wal.layout import CheckpointLayout

CP = Checkpoint(1000, 41_000, (42_000,), 43_100, {"block_interval_ms": 200})


def test_local_store_writes_at_the_layout_path_and_quarantines_beside_it(tmp_path):
    store = CheckpointStore(str(tmp_path))
    assert store.path == CheckpointLayout(str(tmp_path)).checkpoint_file
    store.write(CP)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]
    moved = store.quarantine()
    assert moved is not None and moved.startswith(store.path + ".corrupt-")
    assert store.read() is None


def test_object_store_branch_through_a_given_layout():
    layout = CheckpointLayout("mock:///ckpt")
    assert not layout.is_local
    store = CheckpointStore(layout)
    assert store.layout is layout and store.path == "ckpt/checkpoint.json"
    assert not store.exists()
    store.write(CP)
    assert store.exists() and store.read() == CP
    names = [i.path for i in layout.filesystem.get_file_info(pafs.FileSelector("ckpt"))]
    assert names == ["ckpt/checkpoint.json"]  # no temporary object left
    assert store.quarantine() is not None and store.read() is None


def test_an_unresolvable_directory_is_a_checkpoint_error():
    with pytest.raises(CheckpointError, match="cannot resolve the checkpoint directory"):
        CheckpointStore("nope://bucket/ckpt")
