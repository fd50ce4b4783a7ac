"""Block keepers: the keeper process, copies on two keepers, degraded/restored, every copy read.

Real keepers (Flight servers, in this process or as processes of their own), a
stand-in driver that answers as told; no Spark.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import threading

import pyarrow as pa
import pytest
from waiting import wait_until

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import (
    AuthenticationError,
    BlockNotFoundError,
    BlockStoreError,
    ConfigError,
    RpcError,
)
from spark_receivers.receiver import block_keeper, block_placement
from spark_receivers.receiver.block_keeper import BlockKeeper, KeeperSettings, process_alive
from spark_receivers.receiver.block_placement import (
    KeeperSink,
    effective_level,
    write_spool_file,
)
from spark_receivers.receiver.block_spool import (
    map_spool_file,
    parquet_spool_schema,
    spool_alive,
    sweep_dead_spools,
)
from spark_receivers.receiver.keeper_process import KeeperHandle, ensure_local_keeper, keeper_dir
from spark_receivers.receiver.storage_level import StorageLevel
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.spark.block_fetch import fetch_block
from spark_receivers.testing import ManualClock

MiB = 1024 * 1024


def table(n: int, start: int = 0) -> pa.Table:
    return pa.table({"value": [f"r{i}" for i in range(start, start + n)]})


@pytest.fixture
def secret() -> str:
    return new_secret()


@pytest.fixture
def keepers(secret):
    """Two keepers in this process, as on two executors."""
    made = [
        BlockKeeper(KeeperSettings(secret, "127.0.0.1", os.getpid(), memory_budget_bytes=MiB))
        for _ in range(2)
    ]
    yield made
    for k in made:
        k.close()


@pytest.fixture
def spooling(secret, tmp_path):
    """Two keepers in this process that take local blocks as files (``AdoptBlock``)."""
    made = [
        BlockKeeper(
            KeeperSettings(
                secret,
                "127.0.0.1",
                os.getpid(),
                memory_budget_bytes=MiB,
                spill_dir=str(tmp_path),
                spool=True,
            )
        )
        for _ in range(2)
    ]
    yield made
    for k in made:
        k.close()


class StandInDriver:
    """Answers a sink's driver calls: replica targets as set by the test; records reports."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.calls: list[object] = []

    def call(self, message, timeout_s=None):
        self.calls.append(message)
        if isinstance(message, m.GetReplicaTargets):
            return list(self.targets)
        return True if isinstance(message, m.RegisterBlockKeeper) else None

    def put_table(self, command, table, timeout_s=None) -> None:
        raise AssertionError("the driver takes no blocks")

    def close(self) -> None:
        pass

    def reports(self) -> list[tuple[int, int]]:
        return [(x.achieved, x.wanted) for x in self.calls if isinstance(x, m.ReportReplication)]


def sink_for(
    keeper,
    secret,
    driver,
    level=StorageLevel.MEMORY_AND_DISK_2,
    clock=None,
    restarts=None,
    parquet_spool=False,
):
    """A sink whose local keeper is ``keeper``; ``restarts`` records each ``local(restart)``."""
    handle_of = KeeperHandle(keeper.address, os.getpid(), 0, keeper.spool_dir)

    def local(restart: bool):
        if restarts is not None:
            restarts.append(restart)
        return handle_of

    return KeeperSink(
        0,
        "exec-a",
        "127.0.0.1",
        level,
        local,
        driver,
        lambda address: EndpointClient(address, secret),
        timeout_s=5.0,
        clock=clock or ManualClock(0),
        parquet_spool=parquet_spool,
    )


# --- storage levels ---------------------------------------------------------------------


def test_storage_levels_map_names_and_pyspark_levels_by_their_flags():
    from pyspark import StorageLevel as Py

    assert StorageLevel.of(Py.MEMORY_AND_DISK_2) is StorageLevel.MEMORY_AND_DISK_2
    assert StorageLevel.of(Py.MEMORY_ONLY) is StorageLevel.MEMORY_ONLY
    assert StorageLevel.of(Py.MEMORY_ONLY_2) is StorageLevel.MEMORY_ONLY_2
    assert StorageLevel.of(Py.MEMORY_AND_DISK_DESER) is StorageLevel.MEMORY_AND_DISK
    assert StorageLevel.of("memory_and_disk_ser_2") is StorageLevel.MEMORY_AND_DISK_2
    assert StorageLevel.MEMORY_AND_DISK_2.replication == 2
    assert not StorageLevel.MEMORY_ONLY_2.use_disk
    assert StorageLevel.MEMORY_ONLY_2.with_replication(1) is StorageLevel.MEMORY_ONLY
    for bad in (Py.DISK_ONLY, Py.OFF_HEAP, Py.DISK_ONLY_3, "MEMORY", 2, None):
        with pytest.raises(ConfigError, match="must be one of MEMORY_ONLY, MEMORY_ONLY_2"):
            StorageLevel.of(bad)


def test_the_receiver_wal_and_keepers_off_mean_one_copy(caplog):
    two = StorageLevel.MEMORY_AND_DISK_2
    assert effective_level(two, StreamingConfig(), 0) is two
    wal = StreamingConfig(receiver_wal_enabled=True, checkpoint_dir="/tmp/x")
    assert effective_level(two, wal, 0) is StorageLevel.MEMORY_AND_DISK
    assert "replication 2 is unnecessary when the receiver write-ahead log" in caplog.text
    off = StreamingConfig(block_keeper_enabled=False)
    assert effective_level(StorageLevel.MEMORY_ONLY_2, off, 0) is StorageLevel.MEMORY_ONLY


def test_local_mode_keeps_one_copy_and_says_so_once_as_information(caplog, monkeypatch):
    """Local mode's one executor is Spark's "driver": no other can ever hold a replica, so
    that is said once, at start, as information, not warned as a degraded level every run."""
    import logging

    from spark_receivers.receiver import block_placement

    monkeypatch.setattr(block_placement, "_said_local", threading.Event())
    two = StorageLevel.MEMORY_AND_DISK_2
    caplog.set_level(logging.INFO, logger="spark_receivers.receiver.block_placement")
    for stream in range(3):  # three receivers, or one started three times
        assert effective_level(two, StreamingConfig(), stream, "driver") is (
            StorageLevel.MEMORY_AND_DISK
        )
    said = [r for r in caplog.records if "local mode has one executor" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert effective_level(two, StreamingConfig(), 0, "1") is two  # an executor of a cluster


# --- the keeper server ------------------------------------------------------------------


def test_a_keeper_takes_serves_describes_and_removes_blocks(keepers, secret):
    keeper = keepers[0]
    client = EndpointClient(keeper.address, secret)
    client.put_table(b'{"block": "input-0-1-0", "generated_ms": 5}', table(3))
    assert client.read_table(b"input-0-1-0") == table(3)
    info = client.call(m.DescribeKeeper())
    assert info["blocks"] == 1 and info["memory_bytes"] > 0 and info["pid"] == os.getpid()
    assert client.call(m.RemoveBlocks(("input-0-1-0", "input-0-1-9"))) == 1
    with pytest.raises(RpcError, match="not in this block store"):
        client.read_table(b"input-0-1-0")
    for bad in (b"not json", b'{"block": "../x", "generated_ms": 1}', b'{"block": "input-0-1-1"}'):
        with pytest.raises(RpcError):
            client.put_table(bad, table(1))
    intruder = EndpointClient(keeper.address, new_secret())
    with pytest.raises(AuthenticationError):
        intruder.read_table(b"input-0-1-0")
    client.close()


def test_a_keeper_spills_past_its_budget_for_levels_with_disk(keepers, secret):
    keeper, big = keepers[0], table(60_000)
    assert big.get_total_buffer_size() > MiB // 2
    client = EndpointClient(keeper.address, secret)
    for i in range(3):
        client.put_table(f'{{"block": "input-0-1-{i}", "generated_ms": {i}}}'.encode(), big)
    assert keeper.store.memory_bytes <= MiB and keeper.store.disk_bytes > 0
    assert client.read_table(b"input-0-1-2") == big  # served from disk
    client.put_table(b'{"block": "input-0-1-3", "generated_ms": 3, "use_disk": false}', big)
    assert keeper.store.memory_bytes > MiB  # MEMORY_ONLY: kept in memory, as Spark does
    client.close()


def test_a_keeper_adopts_a_block_file_of_its_spool_and_refuses_any_other_file(spooling, secret):
    keeper = spooling[0]
    spool = keeper.spool_dir
    assert spool and os.path.isdir(spool) and (os.stat(spool).st_mode & 0o777) == 0o700
    client = EndpointClient(keeper.address, secret)
    path = write_spool_file(spool, "input-0-1-0", table(3))
    assert client.call(m.AdoptBlock("input-0-1-0", 5, True, path.name)) is True
    assert path.exists()  # kept while the block is: read tasks of this host map it
    assert client.read_table(b"input-0-1-0") == table(3)
    assert client.call(m.DescribeKeeper())["blocks"] == 1
    os.utime(path, (0, 0))
    assert keeper.sweep_spool() == 0 and path.exists()  # held: never an orphan
    assert client.call(m.RemoveBlocks(("input-0-1-0",))) == 1
    assert not path.exists() and sorted(os.listdir(spool)) == [".alive"]
    kept = write_spool_file(spool, "input-0-1-1", table(1))
    outside = os.path.join(os.path.dirname(spool), "input-0-1-1.x.arrow")
    os.symlink(kept, os.path.join(spool, "input-0-1-1.link.arrow"))
    for block, name, why in [
        ("input-0-1-1", "../" + os.path.basename(outside), "not a block file"),
        ("input-0-1-1", kept.name.replace("input-0-1-1", "input-0-1-2"), "not a block file"),
        ("input-0-1-1", "input-0-1-1.gone.arrow", "could not map"),
        ("input-0-1-1", "input-0-1-1.link.arrow", "not a regular file"),
        ("../x", kept.name, "block"),
    ]:
        with pytest.raises(RpcError, match=why):
            client.call(m.AdoptBlock(block, 1, True, name))
    assert kept.exists()  # a refusal leaves the receiver's file alone
    assert keeper.sweep_spool(older_than_s=3600) == 0
    os.utime(kept, (0, 0))  # a receiver died between writing and handing it over
    assert keeper.sweep_spool() == 1 and not kept.exists()
    client.close()
    keeper.close()
    assert not os.path.exists(spool)  # the spool goes with the keeper


def test_an_adopted_block_over_the_budget_is_kept_as_its_spool_file_not_written_again(
    spooling, secret
):
    keeper = spooling[0]
    client = EndpointClient(keeper.address, secret)
    big = pa.table({"value": ["x" * 1000] * 1500})  # 1.5 MB: over the 1 MiB budget
    path = write_spool_file(keeper.spool_dir, "input-0-1-0", big)
    assert client.call(m.AdoptBlock("input-0-1-0", 5, True, path.name)) is True
    assert keeper.store.memory_bytes == 0 and keeper.store.disk_bytes > MiB
    spilled = [p for p in os.listdir(os.path.dirname(keeper.spool_dir)) if "blocks" in p]
    assert spilled == []  # no second copy was written to the spill directory
    assert client.read_table(b"input-0-1-0") == big  # read from the spool file
    assert client.call(m.RemoveBlocks(("input-0-1-0",))) == 1
    assert not path.exists() and keeper.store.disk_bytes == 0
    client.close()


def test_a_spool_that_cannot_take_the_file_sends_the_block_by_put_said_once(
    spooling, secret, caplog
):
    here = spooling[0]
    sink = sink_for(here, secret, StandInDriver(), StorageLevel.MEMORY_AND_DISK)
    shutil.rmtree(here.spool_dir)  # its disk is gone, say
    for i in range(2):
        assert sink.put(f"input-0-1-{i}", table(2), 100).locations == (here.address,)
        assert here.store.get(f"input-0-1-{i}") == table(2)
    said = [r for r in caplog.records if "into the keeper's spool" in r.getMessage()]
    assert len(said) == 1
    sink.close()


def test_a_spool_file_reserved_ahead_is_read_back_whole_at_its_written_size(tmp_path):
    many = pa.Table.from_batches([b for i in range(40) for b in table(250, i * 250).to_batches()])
    path = write_spool_file(str(tmp_path), "input-0-1-0", many)
    assert path.read_bytes()[-6:] == b"ARROW1"  # it ends where the IPC file ends, not later
    assert map_spool_file(str(path)) == many


def test_a_disk_with_no_room_for_the_reserve_sends_the_block_by_put(spooling, secret, monkeypatch):
    here = spooling[0]
    sink = sink_for(here, secret, StandInDriver(), StorageLevel.MEMORY_AND_DISK)
    monkeypatch.setattr(block_placement, "_reserve", lambda fd, size: errno.ENOSPC)
    with pytest.raises(OSError, match="no room for a block"):
        write_spool_file(here.spool_dir, "input-0-1-9", table(3))
    assert sink.put("input-0-1-0", table(3), 100).locations == (here.address,)
    assert here.store.get("input-0-1-0") == table(3)
    assert os.listdir(here.spool_dir) == [".alive"]  # no file was left half-written
    sink.close()


def test_a_keeper_that_refuses_the_file_gets_the_block_by_put_and_is_not_replaced(
    spooling, secret, monkeypatch
):
    here = spooling[0]
    restarts: list[bool] = []
    sink = sink_for(here, secret, StandInDriver(), StorageLevel.MEMORY_AND_DISK, restarts=restarts)
    monkeypatch.setattr(here, "adopt", lambda message: (_ for _ in ()).throw(RpcError("no")))
    assert sink.put("input-0-1-0", table(3), 100).locations == (here.address,)
    assert here.store.get("input-0-1-0") == table(3)  # by put, from the same keeper
    assert os.listdir(here.spool_dir) == [".alive"]  # the refused file was deleted
    assert True not in restarts  # a refusal is not a dead keeper
    sink.close()


def test_a_parquet_block_is_adopted_from_its_footer_alone_and_decoded_only_when_fetched(
    spooling, secret, monkeypatch
):
    here = spooling[0]
    sink = sink_for(here, secret, StandInDriver(), StorageLevel.MEMORY_AND_DISK, parquet_spool=True)

    def no_decode(path):
        raise AssertionError(f"the keeper decoded {path} to adopt it")

    monkeypatch.setattr(block_keeper, "map_spool_file", no_decode)
    placed = sink.put("input-0-1-0", table(5), 0)
    assert placed.local_file is not None and placed.local_file.endswith(".parquet")
    size = os.path.getsize(placed.local_file)
    assert here.store.memory_bytes == 0 and here.store.disk_bytes == size  # a file, not memory
    client = EndpointClient(here.address, secret)
    assert client.read_table(b"input-0-1-0") == table(5)  # a do_get decodes it
    assert client.call(m.DescribeKeeper())["disk_bytes"] == size
    # A read task of this host reads the file itself: no keeper answers at this endpoint.
    info = m.ReceivedBlockInfo(0, "input-0-1-0", 5, 0, "127.0.0.1:9", local_file=placed.local_file)
    assert fetch_block(info, secret, timeout_s=5) == table(5)
    sink.remove("input-0-1-0", placed.locations)
    assert not os.path.exists(placed.local_file) and here.store.disk_bytes == 0
    client.close()
    sink.close()


def test_a_file_named_parquet_that_is_not_parquet_is_refused_and_left_to_its_writer(
    spooling, secret
):
    keeper = spooling[0]
    client = EndpointClient(keeper.address, secret)
    fake = os.path.join(keeper.spool_dir, "input-0-1-0.abc.parquet")
    with open(fake, "wb") as f:
        f.write(b"not parquet at all")
    with pytest.raises(RpcError, match="could not read the Parquet footer of"):
        client.call(m.AdoptBlock("input-0-1-0", 1, True, "input-0-1-0.abc.parquet"))
    assert os.path.exists(fake) and keeper.store.disk_bytes == 0
    client.close()


@pytest.mark.parametrize(
    ("arrow_type", "spooled_as_parquet"),
    [
        (pa.string(), True),
        (pa.large_string(), True),
        (pa.int8(), True),
        (pa.timestamp("us", tz="UTC"), True),
        (pa.timestamp("ms"), True),
        (pa.decimal128(12, 3), True),
        (pa.list_(pa.struct([("k", pa.string()), ("v", pa.float64())])), True),
        (pa.map_(pa.string(), pa.int64()), True),
        (pa.timestamp("ns", tz="UTC"), False),  # Spark refuses TIMESTAMP(NANOS)
        (pa.uint32(), False),
        (pa.duration("us"), False),
        (pa.null(), False),
        (pa.list_(pa.uint8()), False),
    ],
)
def test_blocks_are_spooled_as_parquet_only_for_types_spark_reads_back_as_they_are(
    arrow_type, spooled_as_parquet
):
    assert parquet_spool_schema(pa.schema([("a", arrow_type)])) is spooled_as_parquet


def test_names_equal_but_for_case_keep_the_arrow_spool(spooling, secret):
    assert not parquet_spool_schema(pa.schema([("Key", pa.string()), ("key", pa.string())]))
    here = spooling[0]
    sink = sink_for(here, secret, StandInDriver(), StorageLevel.MEMORY_AND_DISK, parquet_spool=True)
    twins = pa.table({"Key": ["a"], "key": ["b"]})
    placed = sink.put("input-0-1-0", twins, 0)
    assert placed.local_file is not None and placed.local_file.endswith(".arrow")
    assert here.store.get("input-0-1-0") == twins
    sink.close()


def test_the_keeper_process_is_found_again_and_ends_with_its_executor(secret):
    executor = subprocess.Popen(["sleep", "60"])  # stands in for the executor's JVM
    try:
        settings = KeeperSettings(secret, "127.0.0.1", 0, memory_budget_bytes=MiB, spool=True)
        handle = ensure_local_keeper(settings, watch_pid=executor.pid)
        assert handle.pid != os.getpid() and process_alive(handle.pid)
        assert os.path.isdir(handle.spool_dir)
        again = ensure_local_keeper(settings, watch_pid=executor.pid)
        assert again == handle  # spool included: another receiver finds it on file
        client = EndpointClient(handle.address, secret)
        client.put_table(b'{"block": "input-0-1-0", "generated_ms": 1}', table(2))
        path = write_spool_file(handle.spool_dir, "input-0-1-1", table(3))
        assert client.call(m.AdoptBlock("input-0-1-1", 1, True, path.name)) is True
        assert client.read_table(b"input-0-1-1") == table(3)
        assert client.call(m.DescribeKeeper())["pid"] == handle.pid
        client.close()
        os.kill(executor.pid, signal.SIGKILL)
        executor.wait()
        assert wait_until(lambda: not process_alive(handle.pid)), "the keeper outlived its JVM"
        assert not os.path.exists(handle.spool_dir)
    finally:
        executor.kill()


def test_the_files_of_ended_keepers_go_when_the_next_keeper_is_looked_for(secret):
    executor = subprocess.Popen(["sleep", "60"])  # stands in for the executor's JVM
    other = subprocess.Popen(["sleep", "60"])  # the executor of a later application
    later = None
    try:
        settings = KeeperSettings(secret, "127.0.0.1", 0, memory_budget_bytes=MiB)
        handle = ensure_local_keeper(settings, watch_pid=executor.pid)
        (found,) = [
            p for p in keeper_dir().glob("*.json") if json.loads(p.read_text())["pid"] == handle.pid
        ]
        lock = found.with_suffix(".lock")
        assert lock.exists()
        os.kill(executor.pid, signal.SIGKILL)
        executor.wait()
        assert wait_until(lambda: not process_alive(handle.pid)), "the keeper outlived its JVM"
        later_settings = KeeperSettings(new_secret(), "127.0.0.1", 0, memory_budget_bytes=MiB)
        later = ensure_local_keeper(later_settings, watch_pid=other.pid)
        assert not found.exists() and not lock.exists()
    finally:
        executor.kill()
        other.kill()
        other.wait()
        if later is not None:
            assert wait_until(lambda: not process_alive(later.pid)), "the keeper outlived its JVM"


def test_a_new_keeper_replaces_one_that_stopped_answering(secret):
    executor = subprocess.Popen(["sleep", "60"])
    try:
        settings = KeeperSettings(secret, "127.0.0.1", 0, memory_budget_bytes=MiB)
        first = ensure_local_keeper(settings, watch_pid=executor.pid)
        second = ensure_local_keeper(settings, restart=True, watch_pid=executor.pid)
        assert second.pid != first.pid
        assert wait_until(lambda: not process_alive(first.pid))
        client = EndpointClient(second.address, secret)
        client.call(m.ReleaseKeeper())
        client.close()
        assert wait_until(lambda: not process_alive(second.pid)), "released but still running"
    finally:
        executor.kill()


# --- copies -----------------------------------------------------------------------------


@pytest.mark.parametrize("pair", ["keepers", "spooling"])
def test_a_replicated_block_is_in_two_keepers_before_put_returns(pair, request, secret):
    here, there = request.getfixturevalue(pair)  # spooling: the local copy is a file
    driver = StandInDriver()
    driver.targets = [there.address]
    sink = sink_for(here, secret, driver)
    placed = sink.put("input-0-1-0", table(5), 100)
    assert placed.locations == (here.address, there.address)
    assert here.store.get("input-0-1-0") == there.store.get("input-0-1-0") == table(5)
    if here.spool_dir:  # adopted: the first copy's file, kept until the block goes
        assert placed.local_file and os.path.dirname(placed.local_file) == here.spool_dir
        assert os.path.exists(placed.local_file)
    else:
        assert placed.local_file is None
    assert driver.reports() == [(2, 2)]
    held = sink.held()  # what the metrics report (this executor's keeper)
    assert held.blocks == len(held) == 1 and held.memory_bytes > 0 and held.disk_bytes == 0
    sink.remove("input-0-1-0", placed.locations)
    assert len(here.store) == len(there.store) == 0
    if placed.local_file:
        assert not os.path.exists(placed.local_file)
    sink.close()


def test_no_other_executor_degrades_visibly_and_a_new_one_restores_the_copies(keepers, secret):
    here, there = keepers
    clock = ManualClock(0)
    driver = StandInDriver()
    sink = sink_for(here, secret, driver, clock=clock)
    assert sink.put("input-0-1-0", table(1), 0).locations == (here.address,)
    assert driver.reports() == [(1, 2)]  # degraded: said once, not per block
    sink.put("input-0-1-1", table(1), 0)
    assert driver.reports() == [(1, 2)]
    driver.targets = [there.address]  # a keeper on another executor appears
    clock.advance(6_000)  # the sink asks the driver again
    assert sink.put("input-0-1-2", table(1), 0).locations == (here.address, there.address)
    assert driver.reports() == [(1, 2), (2, 2)]
    there.close()  # its executor dies: the next replica fails, the copies drop
    assert sink.put("input-0-1-3", table(1), 0).locations == (here.address,)
    assert driver.reports() == [(1, 2), (2, 2), (1, 2)]
    sink.close()


def test_a_non_replicated_level_never_asks_for_targets(keepers, secret):
    driver = StandInDriver()
    sink = sink_for(keepers[0], secret, driver, level=StorageLevel.MEMORY_ONLY)
    assert sink.put("input-0-1-0", table(1), 0).locations == (keepers[0].address,)
    assert not any(isinstance(x, m.GetReplicaTargets) for x in driver.calls)
    assert driver.reports() == [(1, 1)]
    sink.close()


# --- reading ----------------------------------------------------------------------------


def test_a_read_falls_back_to_the_replica_when_the_first_copy_is_gone(keepers, secret):
    here, there = keepers
    driver = StandInDriver()
    driver.targets = [there.address]
    sink = sink_for(here, secret, driver)
    placed = sink.put("input-0-1-0", table(4), 0)
    info = m.ReceivedBlockInfo(
        0, "input-0-1-0", 4, 0, placed.locations[0], replica_endpoints=placed.locations[1:]
    )
    here.close()  # the receiver's executor is gone
    assert fetch_block(info, secret, timeout_s=5) == table(4)
    there.close()
    with pytest.raises(
        BlockNotFoundError, match=r"lost block input-0-1-0 of stream 0 \(4 records\)"
    ):
        fetch_block(info, secret, timeout_s=5)
    sink.close()


def test_a_read_on_the_keepers_host_maps_its_spool_file_without_a_flight_call(spooling, secret):
    here = spooling[0]
    sink = sink_for(here, secret, StandInDriver(), StorageLevel.MEMORY_AND_DISK)
    placed = sink.put("input-0-1-0", table(4), 0)
    assert placed.local_file is not None
    # No keeper answers at this endpoint: only the file can give the block.
    info = m.ReceivedBlockInfo(0, "input-0-1-0", 4, 0, "127.0.0.1:9", local_file=placed.local_file)
    assert fetch_block(info, secret, timeout_s=5) == table(4)
    assert m.ReceivedBlockInfo.from_dict(info.to_dict()) == info  # the driver's WAL keeps it
    for wrong in (
        m.ReceivedBlockInfo(0, "input-0-1-0", 5, 0, "127.0.0.1:9", local_file=placed.local_file),
        m.ReceivedBlockInfo(0, "input-0-1-9", 4, 0, "127.0.0.1:9", local_file=placed.local_file),
    ):  # not the records, or not the block, the driver knows: fetched (and not found here)
        with pytest.raises(BlockNotFoundError):
            fetch_block(wrong, secret, timeout_s=5)
    sink.remove("input-0-1-0", placed.locations)  # the batch completed
    with pytest.raises(BlockNotFoundError, match="lost block input-0-1-0"):
        fetch_block(info, secret, timeout_s=5)
    sink.close()


def test_a_spool_file_is_not_read_once_its_keeper_is_gone_and_the_next_keeper_removes_it(
    secret, tmp_path
):
    executor = subprocess.Popen(["sleep", "60"])  # stands in for the executor's JVM
    try:
        settings = KeeperSettings(
            secret, "127.0.0.1", 0, memory_budget_bytes=MiB, spill_dir=str(tmp_path), spool=True
        )
        handle = ensure_local_keeper(settings, watch_pid=executor.pid)
        path = write_spool_file(handle.spool_dir, "input-0-1-0", table(3))
        client = EndpointClient(handle.address, secret)
        assert client.call(m.AdoptBlock("input-0-1-0", 1, True, path.name)) is True
        client.close()
        info = m.ReceivedBlockInfo(0, "input-0-1-0", 3, 0, handle.address, local_file=str(path))
        assert spool_alive(handle.spool_dir)
        assert fetch_block(info, secret, timeout_s=5) == table(3)
        os.kill(handle.pid, signal.SIGKILL)  # no close: its files stay on disk
        assert wait_until(lambda: not process_alive(handle.pid))
        assert path.exists() and not spool_alive(handle.spool_dir)
        with pytest.raises(BlockNotFoundError, match="lost block input-0-1-0"):
            fetch_block(info, secret, timeout_s=5)  # gone with its keeper, as over Flight
        assert sweep_dead_spools(str(tmp_path), min_age_s=3600) == 0  # may still be starting
        assert sweep_dead_spools(str(tmp_path), min_age_s=0) == 1
        assert not os.path.exists(handle.spool_dir)
    finally:
        executor.kill()


def test_a_stopping_receiver_never_starts_a_keeper(keepers, secret):
    keeper = keepers[0]
    restarts: list[bool] = []
    sink = sink_for(
        keeper, secret, StandInDriver(), StorageLevel.MEMORY_AND_DISK, restarts=restarts
    )
    sink.put("input-0-1-0", table(1), 0)
    keeper.close()  # the driver released it: the context stops
    sink.stopping()
    with pytest.raises(BlockStoreError, match="stopping"):
        sink.put("input-0-1-1", table(1), 0)
    assert restarts == [False]  # found once, never started again
    sink.close()
