"""The block store's accounting: what each block costs in memory or on disk, and who owns files.

A block put again under its name replaces the old one (its bytes leave the count, a file the
store wrote is deleted); a block that does not fit the budget is spilled, or kept as the
spool file its caller gave; a file the caller owns outlives the block.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from spark_receivers.errors import BlockNotFoundError
from spark_receivers.receiver.block_spool import read_block_file
from spark_receivers.receiver.block_store import BlockStore
from spark_receivers.receiver.storage_level import StorageLevel


def _table(rows: int) -> pa.Table:
    return pa.table({"value": pa.array([f"line {i:06d}" for i in range(rows)])})


def _ipc_file(path, table: pa.Table) -> str:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return str(path)


def test_a_block_put_again_under_its_name_is_counted_once(tmp_path):
    store = BlockStore(memory_budget_bytes=1 << 30, spill_dir=str(tmp_path))
    small, large = _table(10), _table(1000)
    assert store.put("b-1", small, generated_ms=1) == small.get_total_buffer_size()
    store.put("b-1", large, generated_ms=2)
    assert len(store) == 1
    assert store.memory_bytes == large.get_total_buffer_size()
    assert store.get("b-1").equals(large)
    assert store.remove(["b-1", "b-missing"]) == 1
    assert (store.memory_bytes, store.disk_bytes, len(store)) == (0, 0, 0)


def test_a_block_over_the_budget_is_spilled_and_its_file_removed_with_it(tmp_path):
    first = _table(1000)
    store = BlockStore(
        StorageLevel.MEMORY_AND_DISK,
        memory_budget_bytes=first.get_total_buffer_size(),
        spill_dir=str(tmp_path),
    )
    store.put("b-1", first, generated_ms=1)
    second = _table(500)
    store.put("b-2", second, generated_ms=2)
    assert store.memory_bytes == first.get_total_buffer_size()
    assert store.disk_bytes == second.get_total_buffer_size()
    spilled = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert len(spilled) == 1
    assert store.get("b-2").equals(second)
    # Replacing the spilled block by one that fits frees the disk count and the file.
    store.remove(["b-1"])
    store.put("b-2", _table(10), generated_ms=3)
    assert store.disk_bytes == 0
    assert not os.path.exists(spilled[0])


def test_memory_only_keeps_every_block_in_memory_whatever_the_budget(tmp_path):
    store = BlockStore(StorageLevel.MEMORY_ONLY, memory_budget_bytes=1, spill_dir=str(tmp_path))
    store.put("b-1", _table(100), generated_ms=1)
    assert store.disk_bytes == 0 and store.memory_bytes > 1
    assert not any(files for _, _, files in os.walk(tmp_path))


def test_a_spool_file_the_caller_owns_outlives_its_block(tmp_path):
    table = _table(200)
    spool = _ipc_file(tmp_path / "b-1.arrow", table)
    store = BlockStore(memory_budget_bytes=1, spill_dir=str(tmp_path / "spill"))
    # Over the budget with a file given: kept as that file, not written again.
    store.put("b-1", read_block_file(spool), generated_ms=1, file=spool)
    store.put_file("b-2", spool, num_rows=200, size_bytes=4096, generated_ms=2)
    assert store.memory_bytes == 0
    assert store.disk_bytes == table.get_total_buffer_size() + 4096
    assert store.get("b-2").equals(table)
    store.put_file("b-2", spool, num_rows=200, size_bytes=1024, generated_ms=3)
    assert store.disk_bytes == table.get_total_buffer_size() + 1024
    assert not (tmp_path / "spill").exists()
    store.remove(["b-1", "b-2"])
    assert store.disk_bytes == 0
    assert os.path.exists(spool)
    with pytest.raises(BlockNotFoundError, match="b-1"):
        store.get("b-1")


def test_blocks_older_than_a_time_are_removed_and_clear_drops_the_rest(tmp_path):
    store = BlockStore(memory_budget_bytes=1 << 30, spill_dir=str(tmp_path))
    for i in range(4):
        store.put(f"b-{i}", _table(10), generated_ms=100 * i)
    assert store.remove_older_than(200) == 2
    assert sorted(n for n in ("b-0", "b-1", "b-2", "b-3") if n in store) == ["b-2", "b-3"]
    store.clear()
    assert (len(store), store.memory_bytes, store.disk_bytes) == (0, 0, 0)
