"""ThreadedReceiver without Spark: the worker, stop and interrupt, restarts with backoff, pickling.

The supervisor is tests/receivers/harness.py's HarnessSupervisor, with restart
delays that last until the test releases them (nothing sleeps for a backoff).
"""

from __future__ import annotations

import logging
import random
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark import cloudpickle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receivers"))

from harness import HarnessSupervisor

from spark_receivers import ThreadedReceiver
from spark_receivers.config import StreamingConfig
from spark_receivers.driver.tracking.restart_policy import RestartPolicy
from spark_receivers.errors import ConfigError, ReceiverError

LOGGER = "spark_receivers.receiver.threaded_receiver"


class SteppedSupervisor(HarnessSupervisor):
    """A HarnessSupervisor whose restart delays are recorded and last until :meth:`release`.

    A restart runs on a thread of its own, as the real supervisor's does, but
    as late as is legal: once the worker that asked for it returned. So the
    receiver cannot count on ``is_stopped()`` turning True promptly. It then
    runs ``on_stop``, records the message, error and delay, and waits for the
    test before it starts the receiver again (unless stopped meanwhile).
    """

    def __init__(self, receiver: ThreadedReceiver) -> None:
        super().__init__(receiver)
        self.delays: list[int | None] = []
        self.restart_errors: list[BaseException | None] = []
        self.restart_threads: list[threading.Thread] = []
        self.starts = 0
        self._backoff = threading.Semaphore(0)

    def restart_receiver(self, message: str, error: Any, delay_ms: int | None) -> None:
        caller = threading.current_thread()

        def run() -> None:
            if caller is not threading.main_thread():
                caller.join(5)
            self._stop_receiver()
            with self._changed:
                self.restarts.append(message)
                self.restart_errors.append(error)
                self.delays.append(delay_ms)
                self._changed.notify_all()
            assert self._backoff.acquire(timeout=15), "the test never released the backoff"
            if not self._stopped:
                self.start()

        thread = threading.Thread(target=run, daemon=True, name="stepped-restart")
        self.restart_threads.append(thread)
        thread.start()

    def start(self) -> SteppedSupervisor:
        with self._changed:
            self.starts += 1
            self._changed.notify_all()
        super().start()
        return self

    def release(self) -> None:
        """End one restart's backoff."""
        self._backoff.release()

    def wait_until(self, predicate: Any, timeout_s: float = 15.0) -> None:
        with self._changed:
            assert self._changed.wait_for(predicate, timeout_s), (self.restarts, self.records)


class Scripted(ThreadedReceiver):
    """Each run stores the name of its step, then does it.

    Steps: ``fail`` (raise), ``healthy-fail`` (mark healthy, then raise),
    ``source-error`` (raise a ReceiverError), ``return`` (return at once),
    ``self-restart`` (call restart itself and return), ``raise-on-stop``
    (wait for the stop, then raise), ``idle`` (wait for the stop; the default).
    """

    thread_name_prefix = "scripted"
    transient_attrs = ("_scratch",)

    def __init__(self, *steps: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps = list(steps)
        self.reset_runtime()

    def reset_runtime(self) -> None:
        self._scratch = threading.Lock()  # cannot be pickled: must be dropped

    def receive(self) -> None:
        step = self.steps.pop(0) if self.steps else "idle"
        self.store(step)
        if step == "fail":
            raise RuntimeError("boom")
        if step == "healthy-fail":
            self.mark_healthy()
            raise RuntimeError("boom after health")
        if step == "source-error":
            raise ReceiverError("cannot reach the source at x:1")
        if step == "self-restart":
            self.restart("asked by receive", None, 7)
            return
        if step == "raise-on-stop":
            self.wait()
            raise OSError("closed under me")
        if step == "idle":
            self.wait()


class SocketReader(ThreadedReceiver):
    """Blocks in ``recv`` on a socket pair; ``interrupt`` shuts the socket down."""

    transient_attrs = ("_sock",)
    _sock: socket.socket | None = None

    def __init__(self) -> None:
        super().__init__(stop_timeout_s=10.0)  # the test fails, not hangs, if interrupt fails
        self.interrupts = 0
        self.read_after_stop: bytes | None = None

    def receive(self) -> None:
        mine, theirs = socket.socketpair()
        with mine, theirs:
            self._sock = mine
            self.store("connected")
            if self.stopping:
                return
            self.read_after_stop = mine.recv(1)  # blocks until interrupt()

    def interrupt(self) -> None:
        self.interrupts += 1
        sock = self._sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)


def expected_delays(seed: int, ceilings: list[int]) -> list[int]:
    """Equal jitter, replayed: half the ceiling plus a uniform draw from the other half."""
    rng = random.Random(seed)
    return [int(c / 2 + rng.uniform(0, c / 2)) for c in ceilings]


def test_the_worker_runs_receive_on_a_named_thread_and_stores():
    receiver = Scripted("idle")
    sup = HarnessSupervisor(receiver, stream_id=3).start()
    try:
        assert sup.wait_for(1) == ["idle"]
        assert receiver._thread is not None
        assert receiver._thread.name == "scripted-3"
        assert receiver.stopping is False
        assert receiver.wait(0) is False
    finally:
        sup.shutdown()
    assert not receiver._thread.is_alive()
    assert receiver.stopping is True
    assert sup.restarts == []


def test_stop_interrupts_a_blocking_receive_and_joins_it():
    receiver = SocketReader()
    sup = HarnessSupervisor(receiver).start()
    sup.wait_for(1)
    sup.shutdown()  # on_stop: event, interrupt, join
    assert receiver._thread is not None
    assert not receiver._thread.is_alive()
    assert receiver.interrupts == 1
    assert receiver.read_after_stop == b""
    assert sup.restarts == []


def test_failures_restart_with_capped_exponential_equal_jitter_reset_by_health():
    receiver = Scripted(
        *["fail"] * 5,
        "healthy-fail",
        "idle",
        backoff_base_ms=100,
        max_backoff_ms=1000,
        rng=random.Random(7),
    )
    sup = SteppedSupervisor(receiver).start()
    try:
        for n in range(1, 7):
            sup.wait_until(lambda n=n: len(sup.restarts) == n)
            if n == 5:
                assert receiver.consecutive_failures == 5
            sup.release()
        sup.wait_until(lambda: sup.records[-1:] == ["idle"])
    finally:
        sup.shutdown()
    ceilings = [100, 200, 400, 800, 1000, 100]  # doubling, capped, back to the base after health
    assert sup.delays == expected_delays(7, ceilings)
    for delay, ceiling in zip(sup.delays, ceilings, strict=True):
        assert delay is not None
        assert ceiling // 2 <= delay <= ceiling
    assert sup.delays[:5] == sorted(sup.delays[:5])  # equal jitter never shrinks while doubling
    assert receiver.consecutive_failures == 1
    assert sup.restarts[0] == "Scripted failed: boom"
    assert isinstance(sup.restart_errors[0], RuntimeError)
    assert sup.starts == 7


def test_a_receiver_error_is_the_restart_message():
    receiver = Scripted("source-error", backoff_base_ms=10)
    sup = SteppedSupervisor(receiver).start()
    try:
        sup.wait_until(lambda: sup.restarts)
    finally:
        sup.shutdown()
        sup.release()
    assert sup.restarts == ["cannot reach the source at x:1"]


def test_a_receive_that_returns_restarts_as_a_source_that_ended():
    receiver = Scripted("return", "idle", backoff_base_ms=10, rng=random.Random(1))
    sup = SteppedSupervisor(receiver).start()
    try:
        sup.wait_until(lambda: sup.restarts)
        sup.release()
        sup.wait_until(lambda: sup.records == ["return", "idle"])
    finally:
        sup.shutdown()
    assert sup.restarts == ["Scripted ended: receive() returned while not stopping"]
    assert sup.restart_errors == [None]
    assert sup.delays == expected_delays(1, [10])


def test_a_receive_that_restarts_itself_is_not_restarted_twice():
    receiver = Scripted("self-restart")
    sup = SteppedSupervisor(receiver).start()
    try:
        sup.wait_until(lambda: sup.restarts)
        assert receiver._thread is not None
        receiver._thread.join(5)  # on_stop joined it already; no restart call can follow
        assert not receiver._thread.is_alive()
    finally:
        sup.shutdown()
        sup.release()
    assert len(sup.restart_threads) == 1
    assert sup.restarts == ["asked by receive"]
    assert sup.delays == [7]
    assert receiver.consecutive_failures == 0


def test_an_exception_while_stopping_is_logged_at_info_and_not_restarted(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    receiver = Scripted("raise-on-stop")
    sup = SteppedSupervisor(receiver).start()
    sup.wait_for(1)
    sup.shutdown()
    assert sup.restarts == []
    assert sup.restart_threads == []
    (record,) = [r for r in caplog.records if "stopped while receiving" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert "OSError: closed under me" in record.getMessage()


def test_stop_during_the_backoff_does_not_start_the_receiver_again():
    receiver = Scripted("fail", backoff_base_ms=60_000, max_backoff_ms=60_000)
    sup = SteppedSupervisor(receiver).start()
    sup.wait_until(lambda: sup.restarts)  # stopped, inside its backoff
    assert receiver._thread is not None
    assert not receiver._thread.is_alive()
    sup.shutdown()
    sup.release()
    (restart,) = sup.restart_threads
    restart.join(5)
    assert not restart.is_alive()
    assert sup.starts == 1
    assert receiver.stopping


def test_a_worker_that_outlives_its_run_keeps_seeing_stopping(caplog):
    class Stubborn(ThreadedReceiver):
        """Its first run ignores the stop until the test lets it go."""

        def __init__(self) -> None:
            super().__init__(stop_timeout_s=0.05)
            self.let_go = threading.Event()
            self.seen: list[bool] = []
            self.runs = 0

        def receive(self) -> None:
            self.runs += 1
            if self.runs == 1:
                self.store("first run")
                self.let_go.wait(15)
                self.seen.append(self.stopping)
                return
            self.store("second run")
            self.wait()

    caplog.set_level(logging.INFO, logger=LOGGER)
    receiver = Stubborn()
    sup = SteppedSupervisor(receiver).start()
    try:
        sup.wait_for(1)
        first = receiver._thread
        assert first is not None
        sup.restart_receiver("test restart", None, 0)
        sup.wait_until(lambda: sup.restarts)  # the join timed out: the first worker still runs
        assert first.is_alive()
        sup.release()
        sup.wait_for(2)
        receiver.let_go.set()
        first.join(5)
        assert receiver.seen == [True]  # its own run's event, not the new run's
        assert receiver.stopping is False  # the new run goes on
        assert len(sup.restart_threads) == 1  # the old worker's return restarted nothing
    finally:
        receiver.let_go.set()
        sup.shutdown()
    assert sup.records == ["first run", "second run"]
    assert any("did not stop within stop_timeout_s" in r.getMessage() for r in caplog.records)


def test_pickling_a_started_receiver_drops_its_runtime_state():
    receiver = Scripted("idle", "idle", backoff_base_ms=100, rng=random.Random(5))
    receiver.next_backoff_ms()
    sup = HarnessSupervisor(receiver).start()
    try:
        sup.wait_for(1)
        copy = cloudpickle.loads(cloudpickle.dumps(receiver))
    finally:
        sup.shutdown()
    assert copy._thread is None
    assert copy._stop_event is None
    assert copy._supervisor is None
    assert copy.consecutive_failures == 0
    assert copy._scratch is not receiver._scratch  # dropped, then made anew by reset_runtime
    public = {k: v for k, v in vars(receiver).items() if not k.startswith("_")}
    assert {k: v for k, v in vars(copy).items() if not k.startswith("_")} == public
    again = HarnessSupervisor(copy).start()  # the copy runs on its own
    try:
        assert again.wait_for(1) == ["idle"]
    finally:
        again.shutdown()


def test_a_subclass_that_forgets_super_init_still_works():
    class Forgetful(ThreadedReceiver):
        def __init__(self, word: str) -> None:
            self.word = word  # no super().__init__(): the class-level defaults serve

        def receive(self) -> None:
            self.store(self.word)
            raise RuntimeError("once")

    receiver = Forgetful("hello")
    copy = cloudpickle.loads(cloudpickle.dumps(receiver))
    assert copy.word == "hello"
    sup = SteppedSupervisor(receiver).start()
    try:
        sup.wait_until(lambda: sup.restarts)
    finally:
        sup.shutdown()
        sup.release()
    assert sup.records == ["hello"]
    assert sup.restarts == ["Forgetful failed: once"]
    (delay,) = sup.delays
    assert delay is not None
    assert 250 <= delay <= 500  # the defaults: base 500 ms, equal jitter


@given(
    base=st.integers(1, 10_000),
    cap=st.integers(1, 100_000),
    failures=st.integers(1, 80),
    seed=st.integers(0, 2**32),
)
def test_every_delay_lies_between_half_and_all_of_the_capped_exponential(base, cap, failures, seed):
    receiver = Scripted(backoff_base_ms=base, max_backoff_ms=cap, rng=random.Random(seed))
    for n in range(1, failures + 1):
        ceiling = min(base * 2 ** (n - 1), cap)
        assert ceiling // 2 <= receiver.next_backoff_ms() <= ceiling
    assert receiver.consecutive_failures == failures
    receiver.mark_healthy()
    assert receiver.consecutive_failures == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backoff_base_ms": 0}, "backoff_base_ms must be a number > 0, got 0"),
        ({"max_backoff_ms": -5}, "max_backoff_ms must be a number > 0, got -5"),
        ({"stop_timeout_s": "soon"}, "stop_timeout_s must be a number > 0, got 'soon'"),
    ],
)
def test_bad_options_are_refused_naming_the_key_and_value(options, message):
    with pytest.raises(ConfigError, match=message):
        Scripted(**options)


@given(seed=st.integers(0, 2**32))
def test_the_default_backoff_meets_the_default_restart_policy_as_documented(seed):
    """docs/receivers.md: with the defaults (backoff 500 ms..30 s; 20 restarts in 10 min) a
    source that stays broken fails the context after about 5 to 6 minutes, while a 10 s
    outage costs about 5 restarts. The real delays, added up (no clock involved)."""
    policy = RestartPolicy.of(StreamingConfig())
    receiver = Scripted(rng=random.Random(seed))
    elapsed_ms, failures = 0, 0
    while failures <= policy.max_restarts:  # the one past the limit fails the context
        failures += 1
        if failures <= policy.max_restarts:
            elapsed_ms += receiver.next_backoff_ms()
    assert elapsed_ms < policy.window_ms  # they all fall within one window: the context fails
    assert 4 * 60_000 <= elapsed_ms <= 7 * 60_000
    blip = Scripted(rng=random.Random(seed))
    waited, restarts = 0, 0
    while waited < 10_000:  # the source is back 10 s after it went away
        waited += blip.next_backoff_ms()
        restarts += 1
    assert 4 <= restarts <= 6


def test_a_source_that_stays_down_logs_its_stack_once_then_one_line_a_retry(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    receiver = Scripted(*["source-error"] * 3, "healthy-fail", "idle", backoff_base_ms=10)
    sup = SteppedSupervisor(receiver).start()
    try:
        for n in range(1, 5):
            sup.wait_until(lambda n=n: len(sup.restarts) == n)
            sup.release()
        sup.wait_until(lambda: sup.records[-1:] == ["idle"])
    finally:
        sup.shutdown()
    restarts = [r for r in caplog.records if "restarting in" in r.getMessage()]
    assert [r.exc_info is not None for r in restarts] == [True, False, False, True]
    assert "the stack was logged at the first" in restarts[1].getMessage()
