"""BlockGenerator under a manual clock (Spark's BlockGeneratorSuite, and memory bounds)."""

from __future__ import annotations

import itertools
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_receivers.errors import ReceiverError, StateError
from spark_receivers.receiver.block import Block
from spark_receivers.receiver.block_generator import BlockGenerator, BlockGeneratorState
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.rpc.messages import StreamBlockId
from spark_receivers.testing import ManualClock

WAIT_S = 10


class Fatal(BaseException):
    """Not an Exception: the per-block handler lets it through and the pusher dies."""


class Listener:
    def __init__(
        self,
        fail_pushes: int = 0,
        hold: threading.Event | None = None,
        die_on_push: BaseException | None = None,
        die_on_generate: BaseException | None = None,
    ) -> None:
        self.cond = threading.Condition()
        self.added: list[tuple[object, object]] = []
        self.generated: list[StreamBlockId] = []
        self.pushed: list[Block] = []
        self.errors: list[tuple[str, BaseException]] = []
        self.fatal: list[tuple[str, BaseException]] = []
        self.fail_pushes = fail_pushes
        self.hold = hold
        self.die_on_push = die_on_push
        self.die_on_generate = die_on_generate

    def on_add_data(self, data, metadata):
        self.added.append((data, metadata))

    def on_generate_block(self, block_id):
        if self.die_on_generate is not None:
            raise self.die_on_generate
        with self.cond:
            self.generated.append(block_id)
            self.cond.notify_all()

    def on_push_block(self, block):
        if self.hold is not None:
            self.hold.wait(WAIT_S)
        if self.die_on_push is not None:
            raise self.die_on_push
        with self.cond:
            if self.fail_pushes > 0:
                self.fail_pushes -= 1
                self.cond.notify_all()
                raise RuntimeError("push failed")
            self.pushed.append(block)
            self.cond.notify_all()

    def on_error(self, message, error):
        with self.cond:
            self.errors.append((message, error))
            self.cond.notify_all()

    def on_fatal(self, message, error):
        with self.cond:
            self.fatal.append((message, error))
            self.cond.notify_all()

    def wait_for(self, predicate) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, WAIT_S), "timed out waiting for the generator"

    def records(self) -> list[object]:
        return [r for b in self.pushed for r in b.records]


def make(listener, clock, interval=200, queue_size=10, rate_limiter=None):
    ids = itertools.count()
    return BlockGenerator(
        listener,
        lambda: StreamBlockId(0, 1, next(ids)),
        interval,
        queue_size,
        rate_limiter=rate_limiter,
        clock=clock,
    )


def wait_until(predicate) -> None:
    """Wait for a state no event announces (polls; not a way to let time pass)."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the generator"
        threading.Event().wait(0.001)


def test_tables_and_records_keep_their_order_in_one_block():
    clock = ManualClock(0)
    listener = Listener()
    gen = make(listener, clock)
    gen.start()
    gen.add_data("a")
    gen.add_table(pa.table({"value": ["b", "c"]}))
    gen.add_table(pa.table({"value": ["d"]}))
    gen.add_many(["e", "f"])
    assert gen.add_table(pa.table({"value": pa.array([], pa.string())})) == 0
    clock.advance(200)
    listener.wait_for(lambda: len(listener.pushed) == 1)
    block = listener.pushed[0]
    # Tables stay Arrow (no per-row copy); lists between them stay lists, in order.
    assert [type(p).__name__ for p in block.parts] == ["list", "Table", "Table", "list"]
    assert block.records == ["a", {"value": "b"}, {"value": "c"}, {"value": "d"}, "e", "f"]
    gen.stop()
    with pytest.raises(StateError, match="has been stopped"):
        gen.add_table(pa.table({"value": ["late"]}))


def test_block_generation_and_data_callbacks():
    clock = ManualClock(0)
    listener = Listener()
    gen = make(listener, clock)
    assert gen.state is BlockGeneratorState.INITIALIZED
    gen.start()
    assert gen.state is BlockGeneratorState.ACTIVE

    # Nothing added: ticks cut no block.
    clock.advance(200)
    clock.advance(200)
    gen.add_data("a")
    gen.add_data_with_callback("b", {"m": 1})
    gen.add_many(["c", "d"])
    assert listener.added == [("b", {"m": 1})]
    clock.advance(200)
    listener.wait_for(lambda: len(listener.pushed) == 1)
    block = listener.pushed[0]
    assert block.records == ["a", "b", "c", "d"]
    assert listener.generated == [block.block_id]
    # Stamped with the tick that cut it, minus one interval.
    assert block.generated_ms % 200 == 0 and 0 <= block.generated_ms <= 400

    gen.add_many(["e"])
    clock.advance(200)
    listener.wait_for(lambda: len(listener.pushed) == 2)
    assert listener.pushed[1].records == ["e"]
    assert listener.pushed[0].block_id != listener.pushed[1].block_id
    gen.stop()
    assert gen.state is BlockGeneratorState.STOPPED_ALL


def test_stop_ensures_correct_shutdown():
    clock = ManualClock(0)
    listener = Listener()
    gen = make(listener, clock)
    gen.start()
    gen.add_many([str(i) for i in range(100)])
    gen.add_data("last")
    # Stop without advancing the clock: it cuts and pushes the last block itself.
    gen.stop()
    assert gen.state is BlockGeneratorState.STOPPED_ALL
    assert listener.records() == [*[str(i) for i in range(100)], "last"]
    with pytest.raises(StateError, match="has not been started or has been stopped"):
        gen.add_data("late")
    with pytest.raises(StateError, match="STOPPED_ALL"):
        gen.start()
    gen.stop()  # idempotent


def test_add_before_start_raises():
    gen = make(Listener(), ManualClock(0))
    with pytest.raises(StateError, match="INITIALIZED"):
        gen.add_data("x")


def test_block_push_errors_are_reported():
    clock = ManualClock(0)
    listener = Listener(fail_pushes=1)
    gen = make(listener, clock)
    gen.start()
    gen.add_data("lost")
    clock.advance(200)
    listener.wait_for(lambda: len(listener.errors) == 1)
    message, error = listener.errors[0]
    assert "push" in message
    assert isinstance(error, RuntimeError)
    # The generator goes on with the next block.
    gen.add_data("kept")
    clock.advance(200)
    listener.wait_for(lambda: len(listener.pushed) == 1)
    assert listener.pushed[0].records == ["kept"]
    gen.stop()


def test_memory_stays_bounded_when_the_queue_is_full():
    clock = ManualClock(0)
    hold = threading.Event()
    listener = Listener(hold=hold)
    gen = make(listener, clock, queue_size=2)
    gen.start()
    # One block held by the pusher, two in the queue, one held by the timer.
    for i in range(4):
        gen.add_data(f"r{i}")
        clock.advance(200)
        listener.wait_for(lambda n=i + 1: len(listener.generated) == n)
    wait_until(lambda: gen.waiting_for_room)

    blocked = threading.Event()
    added = threading.Event()

    def producer():
        blocked.set()
        gen.add_data("overflow")
        added.set()

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    assert blocked.wait(WAIT_S)
    # The producer cannot add while the timer waits for room: memory is bounded.
    assert not added.wait(0.3)
    hold.set()
    assert added.wait(WAIT_S)
    gen.stop()
    assert listener.records() == ["r0", "r1", "r2", "r3", "overflow"]


def test_arrow_tables_cut_a_block_at_max_block_bytes_and_wait_for_room():
    """Tables join a block without copying: a byte cap, not only the interval, bounds it."""
    clock = ManualClock(0)  # the timer never ticks in this test
    hold = threading.Event()
    listener = Listener(hold=hold)
    ids = itertools.count()
    gen = BlockGenerator(
        listener, lambda: StreamBlockId(0, 1, next(ids)), 200, 1, clock=clock,
        max_block_bytes=1_000,
    )  # fmt: skip
    table = pa.table({"value": pa.array(range(100), pa.int64())})  # 800 bytes
    gen.start()
    gen.add_table(table)
    assert listener.generated == []  # under the cap: the block stays open
    gen.add_table(table)  # 1,600 bytes: cut now, held by the pusher
    listener.wait_for(lambda: len(listener.generated) == 1)
    gen.add_table(table)
    gen.add_table(table)  # the second block fills the queue of one
    listener.wait_for(lambda: len(listener.generated) == 2)

    added = threading.Event()

    def producer():
        gen.add_table(table)
        gen.add_table(table)  # a third cut: no room until the pusher moves
        added.set()

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    assert not added.wait(0.3)  # held: what a receiver stores stays bounded
    hold.set()
    assert added.wait(WAIT_S)
    t.join(WAIT_S)
    gen.stop()
    assert [len(b.records) for b in listener.pushed] == [200, 200, 200]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.integers(1, 30), st.just("tick")), max_size=40))
def test_every_record_is_pushed_once_in_order(ops):
    clock = ManualClock(0)
    listener = Listener()
    gen = make(listener, clock, interval=100)
    gen.start()
    expected: list[str] = []
    for op in ops:
        if op == "tick":
            clock.advance(100)
        else:
            batch = [f"{len(expected) + i}" for i in range(op)]
            if op % 2:
                gen.add_many(batch)
            else:
                for r in batch:
                    gen.add_data(r)
            expected.extend(batch)
    gen.stop()
    assert listener.records() == expected
    ids = [b.block_id for b in listener.pushed]
    assert len(set(ids)) == len(ids)
    assert all(b.records for b in listener.pushed)


# --- a dead thread never leaves callers hanging ------------------------------------


def start(target) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``target`` on a thread; what it raises lands in the returned list."""
    raised: list[BaseException] = []

    def run():
        try:
            target()
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, raised


def test_a_dead_pusher_fails_blocked_adders_releases_the_timer_and_stop_returns():
    clock = ManualClock(0)
    hold = threading.Event()
    death = Fatal("the pusher's interpreter state is gone")
    listener = Listener(hold=hold, die_on_push=death)
    gen = make(listener, clock, queue_size=1)
    gen.start()
    # One block held by the pusher, one in the queue, one held by the timer.
    for i in range(3):
        gen.add_data(f"r{i}")
        clock.advance(200)
        listener.wait_for(lambda n=i + 1: len(listener.generated) == n)
    wait_until(lambda: gen.waiting_for_room)
    adder, raised = start(lambda: gen.add_data("blocked"))
    many, raised_many = start(lambda: gen.add_many(["blocked too"]))

    hold.set()  # the pusher dies on its block
    adder.join(WAIT_S)
    many.join(WAIT_S)
    assert not adder.is_alive() and not many.is_alive()
    for errors in (raised, raised_many):
        (error,) = errors
        assert isinstance(error, ReceiverError) and "failed" in str(error)
        assert error.__cause__ is death
    assert gen.failure is death
    wait_until(lambda: not gen.waiting_for_room)  # the timer is not stuck on the full queue
    listener.wait_for(lambda: len(listener.fatal) == 1)
    message, error = listener.fatal[0]
    assert error is death and "pushing thread" in message
    assert listener.errors == []  # not reported as a failure of one block
    with pytest.raises(ReceiverError) as info:
        gen.add_data("late")
    assert info.value.__cause__ is death

    clock.advance(200)  # ticks after the failure cut nothing
    gen.stop()  # returns: no stop marker into a full queue, no join on a stuck timer
    assert gen.state is BlockGeneratorState.STOPPED_ALL
    assert listener.pushed == [] and len(listener.fatal) == 1


def test_a_dead_timer_fails_the_generator_and_wakes_adders_waiting_for_tokens():
    clock = ManualClock(0)
    death = RuntimeError("on_generate_block broke")
    listener = Listener()
    limiter = RateLimiter(clock=clock)  # unlimited until the update below
    gen = make(listener, clock, rate_limiter=limiter)
    gen.start()
    gen.add_data("buffered")
    gen.update_rate(1)  # one record/s; the bucket is empty
    adder, raised = start(lambda: gen.add_data("waits for a token"))
    assert clock.wait_for_waiters(1, WAIT_S)  # blocked in the rate limiter

    listener.die_on_generate = death
    clock.advance(200)  # the tick cuts "buffered"; the timer thread dies
    adder.join(WAIT_S)
    assert not adder.is_alive()
    (error,) = raised
    assert isinstance(error, ReceiverError) and error.__cause__ is death
    listener.wait_for(lambda: len(listener.fatal) == 1)
    assert listener.fatal[0][1] is death and "timer thread" in listener.fatal[0][0]
    assert gen.failure is death
    gen.stop()
    assert gen.state is BlockGeneratorState.STOPPED_ALL
    assert listener.pushed == []  # the buffered record was dropped, and logged


def test_stop_wakes_adders_waiting_for_tokens():
    clock = ManualClock(0)
    limiter = RateLimiter(max_rate=1, clock=clock)
    gen = make(Listener(), clock, rate_limiter=limiter)
    gen.start()
    adder, raised = start(lambda: gen.add_data("x"))
    assert clock.wait_for_waiters(1, WAIT_S)
    gen.stop()
    adder.join(WAIT_S)
    assert not adder.is_alive()
    (error,) = raised
    assert isinstance(error, StateError) and "has been stopped" in str(error)
    assert gen.failure is None
