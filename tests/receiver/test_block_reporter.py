"""BlockReporter: blocks reported in order, several per call while the driver is slow."""

from __future__ import annotations

import threading

import pytest

from spark_receivers.errors import ReceiverError, RpcError, StateError
from spark_receivers.receiver.block_reporter import BlockReporter
from spark_receivers.rpc import messages as m


def info(seq: int) -> m.ReceivedBlockInfo:
    return m.ReceivedBlockInfo(0, f"input-0-1-{seq}", 10, 0, "127.0.0.1:1")


class SlowDriver:
    """Answers AddBlocks only when released; records every call."""

    def __init__(self, reply: object = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.cond = threading.Condition()
        self.released = 0
        self.reply = reply

    def __call__(self, message: m.AddBlocks) -> object:
        with self.cond:
            self.calls.append(tuple(i.block_id for i in message.block_infos))
            n = len(self.calls)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.released >= n, 10)
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply if self.reply is not None else [True] * len(message.block_infos)

    def release(self, calls: int = 1) -> None:
        with self.cond:
            self.released += calls
            self.cond.notify_all()

    def wait_calls(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= n, 10)


def test_blocks_that_pile_up_during_a_call_go_together_in_the_next_one():
    driver = SlowDriver()
    reporter = BlockReporter(driver, max_pending=10)
    first = reporter.submit(info(0))
    driver.wait_calls(1)  # in flight, not answered
    rest = [reporter.submit(info(i)) for i in range(1, 5)]
    driver.release()
    driver.wait_calls(2)
    driver.release()
    assert first.result(10) is True
    assert all(f.result(10) is True for f in rest)
    assert driver.calls == [("input-0-1-0",), tuple(f"input-0-1-{i}" for i in range(1, 5))]
    assert reporter.calls == 2
    reporter.close(10)


def test_submit_blocks_while_max_pending_are_unanswered():
    driver = SlowDriver()
    reporter = BlockReporter(driver, max_pending=2)
    reporter.submit(info(0))
    reporter.submit(info(1))
    third_in = threading.Event()

    def third() -> None:
        reporter.submit(info(2))
        third_in.set()

    threading.Thread(target=third, daemon=True).start()
    driver.wait_calls(1)
    assert not third_in.wait(0.2)  # two unanswered: the pusher waits (backpressure)
    driver.release(3)
    assert third_in.wait(10)
    reporter.close(10)
    assert [b for call in driver.calls for b in call] == [f"input-0-1-{i}" for i in range(3)]


def test_a_refused_block_and_a_failed_call_resolve_each_future():
    driver = SlowDriver(reply=[False])
    driver.release(10)
    reporter = BlockReporter(driver)
    assert reporter.submit(info(0)).result(10) is False  # refused by the driver
    driver.reply = RpcError("driver gone")
    with pytest.raises(RpcError, match="driver gone"):
        reporter.submit(info(1)).result(10)
    driver.reply = [True, True]  # two answers for one block: the call's blocks all fail
    with pytest.raises(ReceiverError, match="malformed reply"):
        reporter.submit(info(2)).result(10)
    driver.reply = None
    assert reporter.submit(info(3)).result(10) is True  # and the reporter goes on
    reporter.close(10)


def test_close_reports_what_is_pending_then_refuses_more():
    driver = SlowDriver()
    reporter = BlockReporter(driver)
    futures = [reporter.submit(info(i)) for i in range(3)]
    driver.release(10)
    reporter.close(10)
    assert all(f.done() and f.result() is True for f in futures)
    with pytest.raises(StateError, match="closed"):
        reporter.submit(info(9))


def test_a_dead_reporter_fails_pending_futures_and_later_submits():
    def dies(message: m.AddBlocks) -> object:
        raise SystemExit("killed")  # not an Exception: the thread dies

    reporter = BlockReporter(dies)
    pending = reporter.submit(info(0))
    with pytest.raises(SystemExit):
        pending.result(10)
    assert reporter.flush(10)
    with pytest.raises(ReceiverError, match="died"):
        reporter.submit(info(1))
