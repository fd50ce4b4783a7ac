"""JobGenerator restart from a checkpoint: re-run batches keep their blocks; down time runs."""

from __future__ import annotations

import threading

import pytest

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.batches.checkpoint import Checkpoint
from spark_receivers.driver.batches.job_generator import JobGenerator, OutputOperation
from spark_receivers.driver.batches.received_block_tracker import (
    ReceivedBlockTracker,
    create_driver_wal,
)
from spark_receivers.driver.observe.listener import ListenerBus
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.util.clock import ManualClock


class FakeSparkContext:
    def setJobGroup(self, *args, **kwargs) -> None:
        pass

    def setJobDescription(self, description) -> None:
        pass


class RecordingHooks:
    """BatchHooks that build batches with ``build`` and record everything else."""

    def __init__(self, build) -> None:
        self.build = build
        self.checkpoints: list[tuple[int, list[int]]] = []
        self.failed: list[tuple[int, BaseException]] = []
        self.timer_errors: list[BaseException] = []
        self.cleaned: list[int] = []

    def generate_jobs(self, batch_time_ms, blocks):
        return self.build(batch_time_ms, blocks)

    def batch_failed(self, batch_time_ms, error) -> None:
        self.failed.append((batch_time_ms, error))

    def batch_finished(self, batch_time_ms) -> None:
        pass

    def clean_after_batch(self, batch_time_ms, blocks) -> None:
        self.cleaned.append(batch_time_ms)

    def write_checkpoint(self, last_completed_ms, pending_ms) -> None:
        self.checkpoints.append((last_completed_ms, pending_ms))

    def timer_died(self, error) -> None:
        self.timer_errors.append(error)


def block(seq: int) -> ReceivedBlockInfo:
    return ReceivedBlockInfo(0, f"input-0-1-{seq}", 10, seq, "127.0.0.1:1")


def test_restart_reruns_allocated_batches_with_their_blocks_then_the_down_time(tmp_path):
    clock = ManualClock(10_000)
    cfg = StreamingConfig(driver_wal_fsync=False)
    tracker = ReceivedBlockTracker([0], create_driver_wal(str(tmp_path), cfg, clock), clock)
    tracker.add_block(block(1))
    tracker.allocate_blocks_to_batch(11_000)  # completed before the crash
    tracker.add_block(block(2))
    tracker.add_block(block(3))
    tracker.allocate_blocks_to_batch(12_000)  # allocated, not completed
    tracker.add_block(block(4))  # never allocated
    tracker.stop()
    checkpoint = Checkpoint(1000, 11_000, (12_000,), 12_050, {})

    clock.set_time(15_500)  # the driver was down for a while
    recovered = ReceivedBlockTracker(
        [0], create_driver_wal(str(tmp_path), cfg, clock), clock, recover=True
    )
    ran: dict[int, list[str]] = {}
    done = threading.Condition()

    def build(t: int, blocks: dict[int, list[ReceivedBlockInfo]]) -> list[OutputOperation]:
        def run() -> None:
            with done:
                ran[t] = [b.block_id for b in blocks[0]]
                done.notify_all()

        return [OutputOperation(0, "record", run)]

    hooks = RecordingHooks(build)
    checkpoints = hooks.checkpoints
    bus = ListenerBus()
    generator = JobGenerator(
        FakeSparkContext(),  # type: ignore[arg-type]
        1000,
        recovered,
        hooks,
        bus,
        clock,
    )
    first_timer_tick = generator.start(checkpoint)
    try:
        assert first_timer_tick == 16_000
        assert generator.recovered_batches == [12_000, 13_000, 14_000, 15_000]
        with done:
            assert done.wait_for(lambda: len(ran) == 4, 30)
        assert ran[12_000] == ["input-0-1-2", "input-0-1-3"]  # the same blocks as before
        assert ran[13_000] == ["input-0-1-4"]  # the first down-time batch takes the rest
        assert ran[14_000] == [] and ran[15_000] == []
        assert 11_000 not in ran  # completed before the crash: not run again
        assert generator.last_completed_batch_ms == 15_000
        assert checkpoints[-1][0] == 15_000
    finally:
        generator.stop(graceful=False, timeout_ms=0)
        recovered.stop()


class Doom(BaseException):
    """Something the per-batch handlers do not catch (the timer thread dies of it)."""


class DoomedTracker(ReceivedBlockTracker):
    def allocate_blocks_to_batch(self, batch_time_ms: int) -> None:
        raise Doom(f"allocation of {batch_time_ms} blew up")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dying_timer_tells_its_owner_instead_of_going_quiet():
    clock = ManualClock(10_000)
    hooks = RecordingHooks(lambda t, blocks: [])
    generator = JobGenerator(
        FakeSparkContext(),  # type: ignore[arg-type]
        1000,
        DoomedTracker([0], clock=clock),
        hooks,
        ListenerBus(),
        clock,
    )
    assert generator.start() == 11_000
    try:
        clock.set_time(11_000)
        deadline = threading.Event()
        for _ in range(200):  # bounded: the timer thread reacts to the clock at once
            if hooks.timer_errors:
                break
            deadline.wait(0.01)
        assert len(hooks.timer_errors) == 1
        assert isinstance(hooks.timer_errors[0], Doom)
        assert "11000" in str(hooks.timer_errors[0])
    finally:
        generator.stop(graceful=False, timeout_ms=0)


def test_a_failed_batch_stays_pending_when_a_later_one_completes_and_runs_again(tmp_path):
    clock = ManualClock(10_000)
    cfg = StreamingConfig(driver_wal_fsync=False)
    tracker = ReceivedBlockTracker([0], create_driver_wal(str(tmp_path), cfg, clock), clock)
    done = threading.Condition()
    ran: dict[int, list[str]] = {}

    def build(t: int, blocks: dict[int, list[ReceivedBlockInfo]]) -> list[OutputOperation]:
        def run() -> None:
            with done:
                ran[t] = [b.block_id for b in blocks[0]]
                done.notify_all()
            if blocks[0]:
                raise RuntimeError("the sink is down")

        return [OutputOperation(0, "sink", run)]

    hooks = RecordingHooks(build)
    generator = JobGenerator(FakeSparkContext(), 1000, tracker, hooks, ListenerBus(), clock)  # type: ignore[arg-type]
    generator.start()
    try:
        tracker.add_block(block(1))
        clock.advance(1000)  # batch 11_000: fails
        with done:
            assert done.wait_for(lambda: 11_000 in ran, 30)
        clock.advance(1000)  # batch 12_000: empty, completes after the failure
        with done:
            assert done.wait_for(
                lambda: hooks.checkpoints and hooks.checkpoints[-1][0] == 12_000, 30
            )
    finally:
        generator.stop(graceful=False, timeout_ms=0)
        tracker.stop()
    last, pending = hooks.checkpoints[-1]
    assert (last, pending) == (12_000, [11_000])
    assert tracker.get_blocks_of_batch(11_000)[0]  # not cleaned up: a restart needs them

    recovered = ReceivedBlockTracker(
        [0], create_driver_wal(str(tmp_path), cfg, clock), clock, recover=True
    )
    ran.clear()
    again = JobGenerator(
        FakeSparkContext(), 1000, recovered, RecordingHooks(build), ListenerBus(), clock
    )  # type: ignore[arg-type]
    again.start(Checkpoint(1000, last, tuple(pending), clock.get_time_ms(), {}))
    try:
        assert 11_000 in again.recovered_batches
        with done:
            assert done.wait_for(lambda: 11_000 in ran, 30)
        assert ran[11_000] == ["input-0-1-1"]
    finally:
        again.stop(graceful=False, timeout_ms=0)
        recovered.stop()
