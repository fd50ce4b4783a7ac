"""The receiver tracker's core, without Spark: a fake launcher, a recording outbox, ManualClock."""

from __future__ import annotations

import threading

import pytest

from spark_receivers.driver.batches.received_block_tracker import ReceivedBlockTracker
from spark_receivers.driver.observe.listener import ListenerBus, ReceiverInfo, StreamingListener
from spark_receivers.driver.tracking.receiver_outbox import ReceiverOutbox
from spark_receivers.driver.tracking.receiver_tracker import ReceiverTracker, TrackerState
from spark_receivers.driver.tracking.scheduling_policy import (
    ExecutorCacheTaskLocation,
    ReceiverState,
)
from spark_receivers.errors import RpcError, StateError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint
from spark_receivers.util.clock import ManualClock

E1 = ExecutorCacheTaskLocation("h1", "1")
E2 = ExecutorCacheTaskLocation("h2", "2")


class Quiet(Receiver):
    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass


class FakeLauncher:
    """Records launches; the test plays the launcher's thread by calling the tracker."""

    def __init__(self, executors=(E1, E2)) -> None:
        self.executors = list(executors)
        self.launched: list[int] = []

    def alive_executors(self):
        return list(self.executors)

    def launch(self, stream_id, jobs) -> None:
        self.launched.append(stream_id)


class RecordingOutbox:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def send(self, endpoint, message) -> None:
        self.sent.append((endpoint, message))

    def of(self, kind) -> list[tuple[str, object]]:
        return [(e, x) for e, x in self.sent if isinstance(x, kind)]


class Events(StreamingListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, ReceiverInfo]] = []
        self.cond = threading.Condition()

    def _add(self, kind, info) -> None:
        with self.cond:
            self.events.append((kind, info))
            self.cond.notify_all()

    def on_receiver_started(self, info) -> None:
        self._add("started", info)

    def on_receiver_error(self, info) -> None:
        self._add("error", info)

    def on_receiver_stopped(self, info) -> None:
        self._add("stopped", info)

    def wait(self, n: int) -> list[tuple[str, ReceiverInfo]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.events) >= n, 10)
            return list(self.events)


def receivers(n: int = 2) -> list[Receiver]:
    out = []
    for sid in range(n):
        r = Quiet()
        r._stream_id = sid
        out.append(r)
    return out


@pytest.fixture
def parts():
    clock = ManualClock(1_000)
    bus = ListenerBus()
    events = Events()
    bus.add(events)
    bus.start()
    launcher = FakeLauncher()
    outbox = RecordingOutbox()
    blocks = ReceivedBlockTracker([0, 1], clock=clock)
    tracker = ReceiverTracker(
        receivers(),
        blocks,
        bus,
        launcher,
        outbox,
        clock,  # type: ignore[arg-type]
    )
    yield tracker, launcher, outbox, blocks, events, clock
    bus.stop()


def register(tracker, sid: int, executor=E1, endpoint: str | None = None) -> bool:
    return tracker.handle(
        m.RegisterReceiver(
            sid,
            "Quiet",
            executor.host,
            executor.executor_id,
            endpoint or f"{executor.host}:{9000 + sid}",
        )
    )


def add_block(tracker, sid: int, seq: int, records: int = 10, **kwargs) -> bool:
    info = m.ReceivedBlockInfo(sid, f"input-{sid}-1-{seq}", records, 0, f"h:{9000 + sid}", **kwargs)
    return tracker.handle(m.AddBlock(info))


def test_start_schedules_every_receiver_and_launches_it(parts):
    tracker, launcher, *_ = parts
    tracker.start()
    assert tracker.state is TrackerState.STARTED
    assert sorted(launcher.launched) == [0, 1]
    infos = tracker.tracking_infos()
    assert {i.state for i in infos.values()} == {ReceiverState.SCHEDULED}
    # Spread over both executors, as the scheduling policy does.
    assert {infos[0].scheduled_locations, infos[1].scheduled_locations} == {(E1,), (E2,)}
    with pytest.raises(StateError, match="STARTED"):
        tracker.start()


def test_registration_only_from_where_the_receiver_was_scheduled(parts):
    tracker, _, _, _, events, _ = parts
    tracker.start()
    where = tracker.tracking_infos()[0].scheduled_locations[0]
    elsewhere = E2 if where == E1 else E1
    assert register(tracker, 0, elsewhere) is False
    assert tracker.receiver_states()[0] is ReceiverState.SCHEDULED
    assert register(tracker, 0, where) is True
    assert tracker.receiver_states()[0] is ReceiverState.ACTIVE
    kind, info = events.wait(1)[0]
    assert kind == "started" and info.stream_id == 0 and info.executor_id == where.executor_id
    with pytest.raises(RpcError, match="unknown stream id 7"):
        register(tracker, 7)


def test_the_launchers_last_try_is_accepted_anywhere_until_its_job_ends(parts):
    """Spark Connect cannot place a task: the launcher's last try runs wherever it lands."""
    tracker, _, _, _, events, _ = parts
    tracker.start()
    where = tracker.tracking_infos()[0].scheduled_locations[0]
    elsewhere = E2 if where == E1 else E1
    assert tracker.job_starting(0) is not None
    assert register(tracker, 0, elsewhere) is False
    tracker.place_anywhere(0)
    assert register(tracker, 0, elsewhere) is True
    assert tracker.receiver_states()[0] is ReceiverState.ACTIVE
    assert events.wait(1)[0][1].executor_id == elsewhere.executor_id
    tracker.job_ended(0, "")  # its executor died, say
    assert tracker.restart_receiver(0) == [where]  # the tracker's choice, alive: kept
    assert tracker.job_starting(0) is not None
    assert register(tracker, 0, elsewhere) is False  # strict again for the next job
    assert register(tracker, 0, where) is True


def test_a_start_is_settled_by_a_registration_or_by_a_job_that_ended(parts):
    tracker, *_ = parts
    assert tracker.wait_receivers_started(0) is True  # not started: nothing to wait for
    tracker.start()
    assert tracker.wait_receivers_started(0) is False
    assert tracker.starting_receivers() == [0, 1]
    register(tracker, 0, tracker.tracking_infos()[0].scheduled_locations[0])
    assert tracker.starting_receivers() == [1]
    # Receiver 1's job ends without it registering (refused, or its task failed).
    assert tracker.job_starting(1) is not None
    tracker.job_ended(1, "ModuleNotFoundError: No module named 'x'")
    assert tracker.starting_receivers() == []
    assert tracker.wait_receivers_started(0) is True


def test_waiting_for_receivers_to_start_ends_when_the_tracker_stops(parts):
    tracker, *_ = parts
    tracker.start()
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(tracker.wait_receivers_started(30)))
    waiter.start()
    tracker.stop_receivers()
    waiter.join(30)
    assert waited == [True] and tracker.starting_receivers() == [0, 1]


def test_add_block_validates_what_comes_from_the_network(parts):
    tracker, _, _, blocks, _, _ = parts
    tracker.start()
    assert add_block(tracker, 1, 0, records=25) is True
    assert blocks.unallocated_blocks_of_stream(1)[0].num_records == 25
    assert tracker.records_received(1) == 25 and tracker.records_received() == 25
    with pytest.raises(RpcError, match="unknown stream id 9"):
        tracker.handle(m.AddBlock(m.ReceivedBlockInfo(9, "input-9-1-1", 1, 0, "h:1")))
    with pytest.raises(RpcError, match="does not belong to stream 0"):
        tracker.handle(m.AddBlock(m.ReceivedBlockInfo(0, "input-1-1-1", 1, 0, "h:1")))
    with pytest.raises(RpcError, match="malformed block id"):
        tracker.handle(m.AddBlock(m.ReceivedBlockInfo(0, "../etc/passwd", 1, 0, "h:1")))
    with pytest.raises(RpcError, match="negative record count"):
        add_block(tracker, 0, 1, records=-1)
    with pytest.raises(RpcError, match="receiver WAL is not enabled"):
        add_block(tracker, 0, 2, wal_handle={"path": "/etc/passwd", "offset": 0, "length": 1})
    assert tracker.records_received() == 25  # nothing refused was counted


def test_add_blocks_answers_per_block_and_refuses_a_call_with_one_bad_block(parts):
    tracker, _, _, blocks, _, _ = parts
    tracker.start()

    def infos(*seqs: int, stream: int = 1) -> tuple[m.ReceivedBlockInfo, ...]:
        return tuple(m.ReceivedBlockInfo(1, f"input-{stream}-1-{s}", 10, 0, "h:9001") for s in seqs)

    assert tracker.handle(m.AddBlocks(infos(0, 1, 2))) == [True, True, True]
    assert [b.block_id for b in blocks.unallocated_blocks_of_stream(1)] == [
        "input-1-1-0", "input-1-1-1", "input-1-1-2"
    ]  # fmt: skip
    bad = (*infos(3), *infos(4, stream=0))  # the second one claims another stream's id
    with pytest.raises(RpcError, match="does not belong to stream 1"):
        tracker.handle(m.AddBlocks(bad))
    assert tracker.records_received(1) == 30  # the good block of a refused call is not added
    assert tracker.receiver_statuses()[1].blocks == 3


def test_a_wal_handle_is_vetted_by_the_check_it_was_given():
    vetted = []

    def check(info):
        vetted.append(info.block_id)
        if "evil" in info.wal_handle["path"]:
            raise RpcError(f"block {info.block_id} has a bad WAL handle")

    tracker = ReceiverTracker(
        receivers(1),
        ReceivedBlockTracker([0]),
        ListenerBus(),
        FakeLauncher(),  # type: ignore[arg-type]
        RecordingOutbox(),  # type: ignore[arg-type]
        check_wal_handle=check,
    )
    tracker.start()
    assert add_block(tracker, 0, 1, wal_handle={"path": "/ck/receivedData/0/a", "offset": 0})
    with pytest.raises(RpcError, match="bad WAL handle"):
        add_block(tracker, 0, 2, wal_handle={"path": "/evil", "offset": 0})
    assert vetted == ["input-0-1-1", "input-0-1-2"]


def test_restart_bookkeeping_keeps_a_live_executor_and_moves_off_a_dead_one(parts):
    tracker, launcher, _, _, events, clock = parts
    tracker.start()
    first = tracker.tracking_infos()[0].scheduled_locations
    assert tracker.job_starting(0) == list(first)
    assert register(tracker, 0, first[0])
    # The task died without deregistering: an error with the whole traceback.
    clock.advance(500)
    trace = "Traceback (most recent call last):\n  ...\nPythonException: worker crashed"
    tracker.job_ended(0, "Job aborted: worker crashed", trace)
    status = tracker.receiver_statuses()[0]
    assert status.state == "INACTIVE"
    assert status.last_error == trace
    assert status.last_error_message == (
        f"receiver job failed on executor {first[0].executor_id}: Job aborted: worker crashed"
    )
    assert status.last_error_time_ms == 1_500
    assert [k for k, _ in events.wait(2)] == ["started", "error"]
    # Its executor is alive: it goes back there.
    assert tracker.restart_receiver(0) == list(first)
    assert tracker.job_starting(0) == list(first)
    assert tracker.receiver_statuses()[0].jobs == 2
    assert tracker.receiver_statuses()[0].restarts == 1
    # Its executor is gone: rescheduled on what is alive.
    launcher.executors = [E2] if first[0] == E1 else [E1]
    assert tracker.restart_receiver(0) == launcher.executors
    assert tracker.tracking_infos()[0].state is ReceiverState.SCHEDULED


def test_a_clean_end_after_deregistering_is_not_an_error(parts):
    tracker, _, _, _, events, _ = parts
    tracker.start()
    where = tracker.tracking_infos()[1].scheduled_locations[0]
    assert register(tracker, 1, where)
    assert tracker.handle(m.DeregisterReceiver(1, "Stopped by driver", "")) is True
    tracker.job_ended(1, "")
    assert tracker.receiver_statuses()[1].last_error == ""
    assert [k for k, _ in events.wait(2)] == ["started", "stopped"]


def test_a_receiver_that_deregisters_with_an_error_is_reported_as_an_error(parts):
    """Regression (chaos run): a receiver restarting after its WAL's disk failed deregisters
    with the error; listeners (the ingest command's output) heard only "stopped"."""
    tracker, _, _, _, events, _ = parts
    tracker.start()
    where = tracker.tracking_infos()[1].scheduled_locations[0]
    assert register(tracker, 1, where)
    reason = "block b of stream 1: the write-ahead log failed: [Errno 28] No space left on device"
    assert tracker.handle(m.DeregisterReceiver(1, reason, "Traceback ...\nOSError: ...")) is True
    kinds = events.wait(3)
    assert [k for k, _ in kinds] == ["started", "error", "stopped"]
    assert kinds[1][1].last_error_message == reason
    assert tracker.receiver_statuses()[1].last_error_message == reason


def test_commands_go_to_the_outbox_not_the_network(parts):
    tracker, _, outbox, _, _, _ = parts
    tracker.start()
    for sid in (0, 1):
        assert register(tracker, sid, tracker.tracking_infos()[sid].scheduled_locations[0])
    tracker.update_rate_limit(1, 500.0)
    tracker.cleanup_old_blocks(1234)
    b0 = m.ReceivedBlockInfo(0, "input-0-1-0", 1, 0, "a:1")
    b1 = m.ReceivedBlockInfo(0, "input-0-1-1", 1, 0, "a:1")
    b2 = m.ReceivedBlockInfo(1, "input-1-1-0", 1, 0, "b:2")
    tracker.remove_blocks((b0, b1, b2))
    endpoint = tracker.receiver_statuses()[1].endpoint
    assert outbox.of(m.UpdateRateLimit) == [(endpoint, m.UpdateRateLimit(500.0))]
    assert sorted(e for e, _ in outbox.of(m.CleanupOldBlocks)) == sorted(
        r.endpoint for r in tracker.receiver_statuses()
    )
    assert outbox.of(m.RemoveBlocks) == [
        ("a:1", m.RemoveBlocks(("input-0-1-0", "input-0-1-1"))),
        ("b:2", m.RemoveBlocks(("input-1-1-0",))),
    ]
    assert tracker.receiver_statuses()[1].rate_limit == 500.0
    assert set(tracker.receiver_states().values()) == {ReceiverState.ACTIVE}


def test_stop_tells_receivers_refuses_newcomers_and_releases_every_endpoint(parts):
    tracker, _, outbox, _, _, _ = parts
    tracker.start()
    where0 = tracker.tracking_infos()[0].scheduled_locations[0]
    where1 = tracker.tracking_infos()[1].scheduled_locations[0]
    assert register(tracker, 0, where0, "h:1") and register(tracker, 1, where1, "h:2")
    tracker.stop_receivers()
    assert tracker.state is TrackerState.STOPPING
    assert sorted(e for e, _ in outbox.of(m.StopReceiver)) == ["h:1", "h:2"]
    assert register(tracker, 0, where0, "h:3") is False  # no new registrations
    assert tracker.wait_receivers_stopped(0) is False
    tracker.handle(m.DeregisterReceiver(0, "Stopped by driver", ""))
    assert add_block(tracker, 1, 5)  # a stopping receiver still pushes its last blocks
    tracker.handle(m.DeregisterReceiver(1, "Stopped by driver", ""))
    assert tracker.wait_receivers_stopped(0) is True
    tracker.release_receivers()
    assert sorted(e for e, _ in outbox.of(m.ReleaseReceiver)) == ["h:1", "h:2"]
    tracker.stop()
    assert tracker.state is TrackerState.STOPPED
    with pytest.raises(RpcError, match="shut down"):
        add_block(tracker, 0, 9)


def test_a_relaunched_receiver_gets_the_last_published_rate(parts):
    tracker, _, outbox, _, _, _ = parts
    tracker.start()
    tracker.update_rate_limit(0, 250.0)  # not running yet: nothing to send
    assert outbox.of(m.UpdateRateLimit) == []
    assert register(tracker, 0, tracker.tracking_infos()[0].scheduled_locations[0], "h:7")
    assert outbox.of(m.UpdateRateLimit) == [("h:7", m.UpdateRateLimit(250.0))]


def test_a_receiver_that_never_answers_does_not_delay_add_block_from_others():
    """No network call under a lock AddBlock needs: commands go out on the outbox's threads."""
    secret = new_secret()
    entered, release = threading.Event(), threading.Event()
    fast_got: list[object] = []

    def hang(message):
        entered.set()
        release.wait(60)  # bounded: the test releases it at the end
        return True

    def fast(message):
        fast_got.append(message)
        return True

    slow_server = FlightEndpoint("slow", "127.0.0.1", secret, m.SUPERVISOR_MESSAGES, hang)
    fast_server = FlightEndpoint("fast", "127.0.0.1", secret, m.SUPERVISOR_MESSAGES, fast)
    outbox = ReceiverOutbox(lambda address: EndpointClient(address, secret, timeout_s=30))
    tracker = ReceiverTracker(
        receivers(),
        ReceivedBlockTracker([0, 1]),
        ListenerBus(),
        FakeLauncher(),  # type: ignore[arg-type]
        outbox,
    )
    endpoint = FlightEndpoint("tracker", "127.0.0.1", secret, m.TRACKER_MESSAGES, tracker.handle)
    client = EndpointClient(endpoint.address, secret, timeout_s=10)
    try:
        tracker.start()
        infos = tracker.tracking_infos()
        assert register(tracker, 0, infos[0].scheduled_locations[0], slow_server.address)
        assert register(tracker, 1, infos[1].scheduled_locations[0], fast_server.address)
        # Every driver-local command returns at once, although receiver 0 never answers.
        tracker.cleanup_old_blocks(100)
        tracker.update_rate_limit(0, 10.0)
        assert entered.wait(10), "the slow receiver never got its message"
        # AddBlock from receiver 1, through the real endpoint, while receiver 0 hangs.
        block = m.ReceivedBlockInfo(1, "input-1-1-0", 5, 0, fast_server.address)
        assert client.call(m.AddBlock(block)) is True
        assert not release.is_set()  # it went through while the slow call was still hanging
        assert tracker.records_received(1) == 5
        # The other receiver's messages are delivered meanwhile, too.
        tracker.remove_blocks([block])
        assert outbox.flush(0.0) is False  # the slow endpoint's messages are still queued
        deadline = threading.Event()
        for _ in range(500):
            if any(isinstance(x, m.RemoveBlocks) for x in fast_got):
                break
            deadline.wait(0.01)
        assert m.CleanupOldBlocks(100) in fast_got
        assert m.RemoveBlocks(("input-1-1-0",)) in fast_got
    finally:
        release.set()
        client.close()
        outbox.close(10)
        for server in (endpoint, slow_server, fast_server):
            server.close()
