"""The job scheduler without Spark: its start and stop order, and what fails the context.

Spark is replaced by a stand-in SparkContext/SparkSession (nothing runs on a JVM),
the receivers' jobs by a launcher that plays them (register, store a block, stop
when told), the supervisors' servers by clients that answer in-process. The clock
is a ManualClock moved by the test.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.batches.checkpoint import Checkpoint
from spark_receivers.driver.batches.job_generator import JobGenerator
from spark_receivers.driver.batches.stream_graph import StreamGraph
from spark_receivers.driver.job_scheduler import JobScheduler
from spark_receivers.driver.observe.listener import (
    ListenerBus,
    StreamingListenerEvent,
    StreamingStarted,
)
from spark_receivers.driver.tracking.receiver_launcher import ReceiverLauncher
from spark_receivers.driver.tracking.scheduling_policy import ExecutorCacheTaskLocation
from spark_receivers.errors import ReceiverError, RpcError, StateError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.util.clock import ManualClock

DRIVER = ExecutorCacheTaskLocation("127.0.0.1", "driver")


class Quiet(Receiver):
    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass


class FakeSparkContext:
    master = "local[4]"
    defaultParallelism = 4
    applicationId = "app-test"

    def setJobGroup(self, *args, **kwargs) -> None:
        pass

    def setLocalProperty(self, *args) -> None:
        pass

    def setJobDescription(self, description) -> None:
        pass

    def cancelJobGroup(self, group) -> None:
        pass


class FakeFrame:
    """A batch DataFrame over blocks: counts its actions (the warm-up's among them)."""

    def __init__(self, on_action) -> None:
        self.empty = False
        self.is_cached = False
        self._on_action = on_action

    def persist(self, level):
        return self

    def alias(self, name):
        return self

    def unpersist(self, blocking=False):
        return self

    def count(self):
        self._on_action("count")
        return 0

    def selectExpr(self, *exprs):
        return self

    def groupBy(self, *cols):
        return SimpleNamespace(count=lambda: SimpleNamespace(collect=lambda: []))


class FakeRange:
    """``spark.range(...).mapInArrow(read, schema)`` (a batch's read) without a JVM."""

    def __init__(self, on_action) -> None:
        self._on_action = on_action

    def mapInArrow(self, read, schema):
        return FakeFrame(self._on_action)


class FakeConf(dict):
    """The session's runtime conf: ``get``/``set``/``unset`` (the batch cache sets one key)."""

    def set(self, key, value) -> None:
        self[key] = value

    def unset(self, key) -> None:
        self.pop(key, None)


class FakeSpark:
    def __init__(self, on_action=lambda action: None) -> None:
        self.sparkContext = FakeSparkContext()
        self.conf = FakeConf()
        self._on_action = on_action

    def range(self, *args):
        return FakeRange(self._on_action)

    def createDataFrame(self, rows, schema):
        return SimpleNamespace(empty=True, count=lambda: 0)


class Recorder:
    """One ordered record of what every stand-in saw."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.cond = threading.Condition()

    def add(self, entry: str) -> None:
        with self.cond:
            self.log.append(entry)
            self.cond.notify_all()

    def wait_for(self, entry: str, timeout_s: float = 10) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: entry in self.log, timeout_s), self.log

    def index(self, entry: str) -> int:
        return self.log.index(entry)


class RecordingBus(ListenerBus):
    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self._rec = rec

    def post(self, event: StreamingListenerEvent) -> None:
        if isinstance(event, StreamingStarted):
            self._rec.add("post on_streaming_started")
        super().post(event)


class PlayedReceivers:
    """The launcher: each launched receiver registers and stores one block at once."""

    def __init__(self, rec: Recorder, sc, specs, restart_delay_ms, on_fatal, clock) -> None:
        self.rec = rec
        self.tracker = None

    def wait_for_executors(self):
        self.rec.add("executors")
        return [DRIVER]

    def alive_executors(self):
        return [DRIVER]

    def launch(self, stream_id, jobs) -> None:
        self.rec.add(f"launch {stream_id}")
        self.tracker = jobs
        assert jobs.job_starting(stream_id) == [DRIVER]
        endpoint = f"sup:{stream_id}"
        assert jobs.handle(m.RegisterReceiver(stream_id, "Quiet", "127.0.0.1", "driver", endpoint))
        block = m.ReceivedBlockInfo(stream_id, f"input-{stream_id}-1-0", 7, 0, endpoint)
        assert jobs.handle(m.AddBlock(block))

    def stop(self, timeout_s) -> None:
        # As a real job does, each played receiver's job ends once it was released.
        if self.tracker is not None and self.tracker.receiver_statuses()[0].endpoint:
            self.rec.wait_for("ReleaseReceiver sup:0")
        self.rec.add("launcher stopped")


class Supervisors:
    """The supervisors' side of the outbox: answer in-process, deregister on StopReceiver."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.tracker = None

    def __call__(self, address: str):
        supervisors = self

        class Client:
            def call(self, message, timeout_s=None):
                supervisors.rec.add(f"{type(message).__name__} {address}")
                if isinstance(message, m.StopReceiver):
                    sid = int(address.split(":")[1])
                    supervisors.tracker.handle(m.DeregisterReceiver(sid, "Stopped by driver", ""))
                return True

            def close(self) -> None:
                pass

        return Client()


@pytest.fixture
def world(monkeypatch):
    rec = Recorder()
    clock = ManualClock(10_100)
    spark = FakeSpark(lambda action: rec.add(f"read: {action}"))
    graph = StreamGraph(spark)  # type: ignore[arg-type]
    graph.receiver_stream(Quiet()).foreach_batch(lambda df, t: rec.add(f"batch {t}"), name="record")
    original_start = JobGenerator.start

    def start(self, recovery=None, hold=False):
        rec.add("timer" if recovery is None else "timer (recovering)")
        return original_start(self, recovery, hold)

    monkeypatch.setattr(JobGenerator, "start", start)
    supervisors = Supervisors(rec)
    failures: list[str] = []
    launchers: list[PlayedReceivers] = []

    def make(config=None, recovery=None, launcher_factory=None):
        def played(*args):
            launchers.append(PlayedReceivers(rec, *args))
            return launchers[-1]

        scheduler = JobScheduler(
            spark,  # type: ignore[arg-type]
            graph,
            1000,
            config or StreamingConfig(),
            "secret",
            "127.0.0.1",
            RecordingBus(rec),
            clock,
            lambda: failures.append("failed"),
            recovery,
            launcher_factory=launcher_factory or played,
            client_factory=supervisors,
        )
        return scheduler

    yield SimpleNamespace(
        rec=rec,
        clock=clock,
        graph=graph,
        make=make,
        supervisors=supervisors,
        failures=failures,
        spark=spark,
    )


def ticking(clock: ManualClock) -> threading.Event:
    """Move the manual clock a batch ahead every few ms until the returned event is set."""
    done = threading.Event()

    def run() -> None:
        for _ in range(3000):  # bounded
            if done.wait(0.005):
                return
            clock.advance(1000)

    threading.Thread(target=run, daemon=True).start()
    return done


def test_every_part_exists_before_start_and_the_endpoint_answers_only_after_it(world):
    """Construction makes every part and runs none; start() starts them."""
    scheduler = world.make()
    client = EndpointClient(scheduler.status("INITIALIZED").tracker_address or "", "secret")
    try:
        status = scheduler.status("INITIALIZED")  # no part is missing before start()
        assert [(r.stream_id, r.state) for r in status.receivers] == [(0, "INACTIVE")]
        assert (status.batches_completed, status.records_received) == (0, 0)
        assert world.rec.log == []  # nothing posted, launched, read or timed
        # Bound (the receivers' task specs name its address) but answering nothing yet.
        with pytest.raises(RpcError, match="receiver-tracker is not serving yet"):
            client.call(m.GetAcceptedPosition(0))
        scheduler.start()
        # From start() on, the tracker that exists answers (the played receiver stored
        # no position, so none was accepted).
        assert client.call(m.GetAcceptedPosition(0)) is None
    finally:
        client.close()
        scheduler.stop(graceful=False, timeout_ms=0)


def test_a_scheduler_never_started_closes_what_it_made_at_stop(world):
    scheduler = world.make()
    address = scheduler.status("INITIALIZED").tracker_address or ""
    scheduler.stop(graceful=False, timeout_ms=0)
    client = EndpointClient(address, "secret", timeout_s=5)
    try:
        with pytest.raises(RpcError):
            client.ping()
    finally:
        client.close()
    assert scheduler.status("STOPPED").tracker_address is None
    assert world.rec.log == []
    with pytest.raises(StateError, match="started or stopped already"):
        scheduler.start()


def test_start_posts_started_warms_up_then_launches_receivers_then_starts_the_timer(world):
    scheduler = world.make()
    world.supervisors.tracker = None
    scheduler.start()
    try:
        log = world.rec.log
        # The batch path is warmed up (a read of blocks) before any
        # receiver runs and before the first batch time.
        assert log[:6] == [
            "post on_streaming_started", "executors", "read: count", "read: count", "launch 0",
            "timer",
        ]  # fmt: skip
        with pytest.raises(StateError, match="ACTIVE"):
            world.graph.receiver_stream(Quiet())
    finally:
        scheduler.stop(graceful=False, timeout_ms=0)


def test_no_warm_up_when_its_timeout_is_zero(world):
    scheduler = world.make(StreamingConfig(warm_up_timeout_s=0))
    scheduler.start()
    try:
        assert world.rec.log[:4] == ["post on_streaming_started", "executors", "launch 0", "timer"]
    finally:
        scheduler.stop(graceful=False, timeout_ms=0)


@pytest.mark.timeout(120)
def test_a_warm_up_that_fails_at_once_does_not_hold_start_for_its_timeout(world, monkeypatch):
    """The warm-up's own failure (here before its first job) ends its wait at once.

    It once left its event unset when anything outside its Spark jobs raised, so start()
    waited the whole ``spark.receivers.warmUp.timeout``; with 600 s here, pytest's 120 s
    would end the test.
    """
    from spark_receivers.driver.batches.batch_reader import BatchReader

    def broken(self, network):
        raise RuntimeError("the warm-up broke before its first job")

    monkeypatch.setattr(BatchReader, "_warm_up_once", broken)
    scheduler = world.make(StreamingConfig(warm_up_timeout_s=600))
    scheduler.start()
    try:
        assert world.rec.log[:4] == ["post on_streaming_started", "executors", "launch 0", "timer"]
    finally:
        scheduler.stop(graceful=False, timeout_ms=0)


class StartingReceivers(PlayedReceivers):
    """The launcher: a launched receiver registers only when the test says so."""

    def launch(self, stream_id, jobs) -> None:
        self.rec.add(f"launch {stream_id}")
        self.tracker = jobs
        assert jobs.job_starting(stream_id) == [DRIVER]

    def register(self, stream_id: int) -> None:
        self.rec.add(f"register {stream_id}")
        assert self.tracker is not None
        registration = m.RegisterReceiver(stream_id, "Quiet", "127.0.0.1", "driver", "sup:0")
        assert self.tracker.handle(registration)


def starting_receivers(world) -> tuple[list[StartingReceivers], object]:
    launchers: list[StartingReceivers] = []

    def factory(*args):
        launchers.append(StartingReceivers(world.rec, *args))
        return launchers[-1]

    return launchers, factory


def test_a_recovering_start_allocates_the_batches_to_redo_before_any_receiver_runs(world, tmp_path):
    config = StreamingConfig(checkpoint_dir=str(tmp_path), driver_wal_fsync=False)
    recovery = Checkpoint(1000, -1, (10_000,), 9_100, {})  # batch 10000 was pending
    launchers, factory = starting_receivers(world)
    scheduler = world.make(config, recovery, launcher_factory=factory)
    scheduler.start()
    try:
        log = world.rec.log
        assert log.index("timer (recovering)") < log.index("launch 0")
        assert scheduler.block_tracker.allocated_batch_times() == [10_000]
        assert scheduler.job_generator.pending_batches() == [10_000]
        # The batch to redo waits for the receiver: it runs once the receiver registered.
        launchers[0].register(0)
        world.rec.wait_for("batch 10000")
        assert log.index("launch 0") < log.index("register 0") < log.index("batch 10000")
    finally:
        scheduler.stop(graceful=False, timeout_ms=0)


def test_batches_to_redo_run_without_a_receiver_whose_job_ended(world, tmp_path):
    config = StreamingConfig(checkpoint_dir=str(tmp_path), driver_wal_fsync=False)
    _, factory = starting_receivers(world)
    scheduler = world.make(config, Checkpoint(1000, -1, (10_000,), 9_100, {}), factory)
    scheduler.start()
    try:
        world.rec.add("job ended")
        scheduler.receiver_tracker.job_ended(0, "no such module")
        world.rec.wait_for("batch 10000")
        assert world.rec.index("job ended") < world.rec.index("batch 10000")
    finally:
        scheduler.stop(graceful=False, timeout_ms=0)


def test_a_graceful_stop_lets_a_receiver_still_starting_finish_first(world):
    launchers, factory = starting_receivers(world)
    scheduler = world.make(launcher_factory=factory)
    scheduler.start()
    world.supervisors.tracker = scheduler.receiver_tracker
    # The stop's first step cancels the warm-up's jobs: from then on, it is stopping.
    world.spark.sparkContext.cancelJobGroup = lambda group: world.rec.add("stop begins")
    stopper = threading.Thread(target=scheduler.stop, args=(True, 10_000))
    done = ticking(world.clock)
    try:
        stopper.start()
        world.rec.wait_for("stop begins")
        launchers[0].register(0)  # not refused: the stop waits for it
        stopper.join(60)
    finally:
        done.set()
    assert not stopper.is_alive()
    log = world.rec.log
    # It registered, then was told to stop: it started, and it stopped as asked.
    assert log.index("stop begins") < log.index("register 0") < log.index("StopReceiver sup:0")
    assert scheduler.status("STOPPED").receivers[0].endpoint == "sup:0"


def test_graceful_stop_stops_receivers_processes_everything_then_releases_them(world):
    scheduler = world.make()
    scheduler.start()
    world.supervisors.tracker = scheduler.receiver_tracker
    assert scheduler.status("ACTIVE").records_received == 7
    done = ticking(world.clock)
    try:
        scheduler.stop(graceful=True, timeout_ms=10_000)
    finally:
        done.set()
    log = world.rec.log
    batches = [e for e in log if e.startswith("batch ")]
    assert batches, log
    stop_at = log.index("StopReceiver sup:0")
    release_at = log.index("ReleaseReceiver sup:0")
    # Receivers are told to stop first; the batch holding their last block runs; only
    # then are they released, and the launcher stops after that.
    assert stop_at < log.index(batches[-1]) < release_at < log.index("launcher stopped")
    status = scheduler.status("STOPPED")
    assert status.records_processed == 7 and status.records_received == 7
    assert status.receivers[0].state == "INACTIVE"
    assert world.failures == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dying_timer_fails_the_context(world):
    scheduler = world.make()
    scheduler.start()
    try:

        def doom(batch_time_ms: int) -> None:
            raise SystemExit(f"allocation of {batch_time_ms} exits")

        scheduler.block_tracker.allocate_blocks_to_batch = doom  # type: ignore[method-assign]
        world.clock.advance(1000)
        for _ in range(500):  # bounded: the timer reacts to the clock at once
            if world.failures:
                break
            threading.Event().wait(0.01)
        assert world.failures == ["failed"]
        assert isinstance(scheduler.error, SystemExit)
        assert "exits" in (scheduler.status("STOPPED").failure or "")
    finally:
        scheduler.stop(graceful=False, timeout_ms=0)


class Py4JGone(FakeSparkContext):
    """A SparkContext whose JVM went away: every call into it fails."""

    @property
    def _jsc(self):
        raise RuntimeError("py4j: Answer from Java side is empty")


def test_a_dying_launcher_fails_the_context(world):
    """The real ReceiverLauncher: a py4j error in its relaunch loop fails the context."""

    def real_launcher(sc, specs, restart_delay_ms, on_fatal, clock):
        launcher = ReceiverLauncher(Py4JGone(), specs, 0, on_fatal, clock)  # type: ignore[arg-type]
        launcher.wait_for_executors = lambda: [DRIVER]  # type: ignore[method-assign]
        original = launcher.alive_executors
        calls = []

        def alive():
            calls.append(1)
            return [DRIVER] if len(calls) == 1 else original()

        launcher.alive_executors = alive  # type: ignore[method-assign]
        return launcher

    scheduler = world.make(launcher_factory=real_launcher)
    scheduler.start()
    try:
        for _ in range(500):  # bounded: the launcher thread fails on its first relaunch
            if world.failures:
                break
            threading.Event().wait(0.01)
        assert world.failures == ["failed"]
        assert isinstance(scheduler.error, ReceiverError)
        assert "launcher of receiver 0 died" in str(scheduler.error)
        assert "Answer from Java side is empty" in str(scheduler.error.__cause__)
        status = scheduler.status("STOPPED").receivers[0]
        assert status.jobs == 1 and "receiver job failed" in status.last_error_message
    finally:
        scheduler.stop(graceful=False, timeout_ms=0)


def test_a_failed_batch_reports_the_blocks_it_lost_then_fails_the_context(world):
    from spark_receivers.driver.observe.listener import StreamingListener

    lost = []

    class Lost(StreamingListener):
        def on_block_lost(self, info) -> None:
            lost.append(info)

    scheduler = world.make()
    scheduler._bus.add(Lost())
    scheduler.start()
    try:
        inner = RuntimeError(
            "lost block input-0-7-3 of stream 0 (12 records) could not be read: gone"
        )
        outer = RuntimeError("Job aborted due to stage failure")
        outer.__cause__ = inner
        scheduler.batch_failed(11_000, outer)
        assert world.failures == ["failed"] and scheduler.error is outer
    finally:
        scheduler.stop(graceful=False, timeout_ms=0)  # delivers what the bus holds
    ((info),) = lost
    assert (info.batch_time_ms, info.stream_id, info.block_id, info.num_records) == (
        11_000,
        0,
        "input-0-7-3",
        12,
    )
    assert info.reason.startswith("lost block input-0-7-3")


def test_a_batch_cut_short_by_a_stop_at_once_does_not_fail_the_context(world):
    """A stop with graceful=False releases the blocks under a running batch: not a failure."""
    scheduler = world.make()
    scheduler.start()
    scheduler.stop(graceful=False, timeout_ms=0)
    error = RuntimeError("lost block input-0-7-3 of stream 0 (12 records) could not be read")
    scheduler.batch_failed(11_000, error)
    assert world.failures == [] and scheduler.error is None
