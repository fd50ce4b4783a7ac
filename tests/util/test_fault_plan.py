"""The fault plan (a testing aid): partitions and WAL disk faults switched on by a file.

Unit tests under a ManualClock, then the hooks where they sit: a real supervisor
against a stand-in tracker (a cut receiver sends no AddBlock, its store fails,
its block server refuses the driver, and all of it works again after the
window), and a real file-based WAL whose fsync fails with ENOSPC then EIO.
"""

from __future__ import annotations

import errno
import json
import threading
import time

import pytest

from spark_receivers import Receiver
from spark_receivers.config import StreamingConfig
from spark_receivers.errors import ConfigError, RpcError, WriteAheadLogError
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.testing import ManualClock, StandInTracker, supervise
from spark_receivers.util.fault_plan import (
    FaultPlan,
    PlannedFault,
    cut_check,
    cut_client,
    wal_fsync_hook,
)
from spark_receivers.wal.file_log import FileBasedWriteAheadLog


class Calls:
    """A client stand-in that counts what reached it."""

    address = "127.0.0.1:1"
    _timeout_s = 30.0

    def __init__(self) -> None:
        self.calls: list[object] = []

    def call(self, message, timeout_s=None):
        self.calls.append(message)
        return True

    def ping(self, timeout_s=None):
        self.calls.append("ping")
        return 1


def plan_file(tmp_path, *faults: PlannedFault) -> str:
    path = str(tmp_path / "plan.json")
    FaultPlan.write(path, faults)
    return path


def config(path: str) -> StreamingConfig:
    return StreamingConfig(fault_plan=path)


def test_no_plan_configured_means_the_plain_objects():
    cfg = StreamingConfig()
    client = Calls()
    assert cut_client(client, cfg, 0) is client
    assert cut_check(cfg, 0) is None
    assert wal_fsync_hook(cfg, 0) is None


def test_the_spark_key_sets_the_plan():
    cfg = StreamingConfig.from_spark_conf({"spark.receivers.testing.faultPlan": " /tmp/p.json "})
    assert cfg.fault_plan == "/tmp/p.json"


def test_a_missing_file_is_no_fault_and_a_new_file_is_read(tmp_path):
    clock = ManualClock(1_000)
    path = str(tmp_path / "plan.json")
    plan = FaultPlan(path, clock)
    assert plan.active("partition", 0) is None
    FaultPlan.write(path, [PlannedFault("partition", 500, 2_000, stream=0)])
    assert plan.active("partition", 0) is not None
    assert plan.active("partition", 1) is None  # another stream
    assert plan.active("wal_disk", 0) is None  # another kind
    clock.set_time(2_000)  # the window is [from_ms, until_ms)
    assert plan.active("partition", 0) is None


def test_a_fault_without_a_stream_covers_every_stream(tmp_path):
    plan = FaultPlan(plan_file(tmp_path, PlannedFault("wal_disk", 0, 10, errno="ENOSPC")))
    plan.clock = ManualClock(5)
    assert plan.active("wal_disk", 7) is not None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"kind": "flood"}, "kind must be one of partition, wal_disk"),
        ({"until_ms": 5}, "until_ms (5) must be after from_ms (10)"),
        ({"mode": "drop"}, "mode must be one of fail, hang"),
        ({"errno": "EPERM"}, "errno must be one of ENOSPC, EIO"),
        ({"from_ms": -1}, "from_ms must be an integer >= 0"),
        ({"stream": "0"}, "stream must be an integer"),
    ],
)
def test_a_bad_fault_is_refused_naming_the_problem(fields, problem):
    with pytest.raises(ConfigError, match="bad fault") as e:
        PlannedFault(**{"kind": "partition", "from_ms": 10, "until_ms": 20, **fields})
    assert problem in str(e.value)


def test_a_bad_file_raises_from_the_hook_naming_it(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    hook = cut_check(config(str(path)), 0)
    assert hook is not None
    with pytest.raises(ConfigError, match=r"cannot read the fault plan .*plan\.json"):
        hook("StopReceiver")
    path.write_text(json.dumps({"faults": [{"kind": "partition", "from_ms": 0, "until_ms": 1,
                                            "extra": 1}]}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"unknown fault field\(s\) \['extra'\]"):
        hook("StopReceiver")


def test_a_cut_client_fails_without_calling_through_then_recovers(tmp_path):
    clock = ManualClock(1_000)
    path = plan_file(tmp_path, PlannedFault("partition", 1_000, 31_000, stream=3))
    inner = Calls()
    client = cut_client(inner, config(path), 3, clock)
    with pytest.raises(RpcError, match="receiver 3 is cut off from the driver until 31000"):
        client.call(m.DeregisterReceiver(3, "x", ""))
    with pytest.raises(RpcError):
        client.ping()
    assert inner.calls == []  # nothing was sent
    clock.set_time(31_000)
    assert client.call(m.DeregisterReceiver(3, "x", "")) is True
    assert client.ping() == 1
    assert len(inner.calls) == 2
    assert client.address == inner.address  # the rest is the client's own


def test_a_hanging_cut_waits_for_the_end_of_the_fault_then_fails(tmp_path):
    clock = ManualClock(0)
    path = plan_file(tmp_path, PlannedFault("partition", 0, 5_000, stream=0, mode="hang"))
    inner = Calls()
    client = cut_client(inner, config(path), 0, clock)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            client.call(m.DeregisterReceiver(0, "x", ""))
        except RpcError as e:
            errors.append(e)

    t = threading.Thread(target=call)
    t.start()
    assert clock.wait_for_waiters(1)
    assert t.is_alive()  # hanging, as a call into dropped packets does
    clock.set_time(5_000)
    t.join(10)
    assert not t.is_alive() and len(errors) == 1 and inner.calls == []


def test_a_hanging_cut_gives_up_at_the_call_timeout(tmp_path):
    clock = ManualClock(0)
    path = plan_file(tmp_path, PlannedFault("partition", 0, 60_000, mode="hang"))
    client = cut_client(Calls(), config(path), 0, clock)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            client.call(m.DeregisterReceiver(0, "x", ""), 2.0)
        except RpcError as e:
            errors.append(e)

    t = threading.Thread(target=call)
    t.start()
    assert clock.wait_for_waiters(1)
    clock.set_time(2_000)  # the call's own timeout, long before the fault ends
    t.join(10)
    assert not t.is_alive() and len(errors) == 1


def test_the_wal_fsync_hook_fails_with_the_planned_errno_then_syncs(tmp_path):
    clock = ManualClock(0)
    path = plan_file(
        tmp_path,
        PlannedFault("wal_disk", 100, 200, stream=0, errno="ENOSPC"),
        PlannedFault("wal_disk", 200, 300, stream=0, errno="EIO"),
    )
    hook = wal_fsync_hook(config(path), 0, clock)
    assert hook is not None
    wal = FileBasedWriteAheadLog(str(tmp_path / "wal"), fsync_hook=hook, max_failures=2)
    wal.write(b"before", 10)
    clock.set_time(150)
    with pytest.raises(WriteAheadLogError, match="No space left on device") as e:
        wal.write(b"lost-1", 150)
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
    clock.set_time(250)
    with pytest.raises(WriteAheadLogError) as e:
        wal.write(b"lost-2", 250)
    assert e.value.__cause__.errno == errno.EIO
    clock.set_time(300)
    wal.write(b"after", 300)
    wal.close()
    # A record whose sync failed was cut off: only the acknowledged ones are read back.
    assert list(FileBasedWriteAheadLog(str(tmp_path / "wal")).read_all()) == [b"before", b"after"]


class Storing(Receiver):
    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass


def test_a_cut_supervisor_sends_no_add_block_and_its_server_refuses_the_driver(tmp_path):
    """The hooks where they sit: a reliable store fails, nothing reaches the tracker."""
    tracker = StandInTracker()
    path = str(tmp_path / "plan.json")
    receiver = Storing()
    sup = supervise(tracker, receiver, fault_plan=path)
    driver_side = EndpointClient(sup.endpoint, tracker.secret, timeout_s=10)
    try:
        sup.start()
        receiver.store(["a", "b"], reliable=True)
        assert tracker.records() == 2
        # The plan's windows are on the wall clock (every process reads it): a wide one.
        start = int(time.time() * 1000) - 1_000
        FaultPlan.write(path, [PlannedFault("partition", start, start + 3_600_000, stream=0)])
        with pytest.raises(RpcError, match=r"AddBlocks? to .* receiver 0 is cut off"):
            receiver.store(["c", "d"], reliable=True)
        assert tracker.records() == 2  # no AddBlock reached the driver
        with pytest.raises(RpcError, match=r"the driver's UpdateRateLimit failed: .*cut off"):
            driver_side.call(m.UpdateRateLimit(100.0))
        FaultPlan.write(path, [])  # the path is back
        receiver.store(["e"], reliable=True)
        assert tracker.records() == 3
        assert driver_side.call(m.UpdateRateLimit(100.0)) is True
    finally:
        driver_side.close()
        sup.stop("test over")
        tracker.close()
