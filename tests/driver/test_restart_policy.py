"""The restart policy: a receiver that keeps failing fails the context, with the cause.

The tracker core without Spark: a fake launcher (the test plays the launcher's
thread), ManualClock for the window.
"""

from __future__ import annotations

import pytest
from test_receiver_tracker import Events, FakeLauncher, RecordingOutbox, receivers, register

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.batches.received_block_tracker import ReceivedBlockTracker
from spark_receivers.driver.observe.listener import ListenerBus
from spark_receivers.driver.tracking.receiver_launcher import summarize_failure
from spark_receivers.driver.tracking.receiver_tracker import ReceiverTracker
from spark_receivers.driver.tracking.restart_policy import RestartCounter, RestartPolicy
from spark_receivers.errors import BadRecordError, ConfigError, ReceiverError
from spark_receivers.rpc import messages as m
from spark_receivers.util.clock import ManualClock


class Fatal:
    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def __call__(self, error: BaseException) -> None:
        self.errors.append(error)


@pytest.fixture
def make():
    buses: list[ListenerBus] = []

    def make(max_restarts: int = 3, window_ms: int = 60_000):
        clock = ManualClock(1_000)
        bus = ListenerBus()
        events = Events()
        bus.add(events)
        bus.start()
        buses.append(bus)
        fatal = Fatal()
        tracker = ReceiverTracker(
            receivers(1),
            ReceivedBlockTracker([0], clock=clock),
            bus,
            FakeLauncher(),  # type: ignore[arg-type]
            RecordingOutbox(),  # type: ignore[arg-type]
            clock,  # type: ignore[arg-type]
            restart_policy=RestartPolicy(max_restarts, window_ms),
            on_fatal=fatal,
        )
        tracker.start()
        return tracker, clock, events, fatal

    yield make
    for bus in buses:
        bus.stop()


def where(tracker):
    return tracker.tracking_infos()[0].scheduled_locations[0]


def fail_in_task(tracker, message="cannot listen on 127.0.0.1:8080: address in use"):
    """The supervisor restarts its receiver after an error: deregister with it, register again."""
    tracker.handle(m.DeregisterReceiver(0, message, f"Traceback ...\nReceiverError: {message}"))
    return register(tracker, 0, where(tracker))


def test_a_receiver_failing_past_max_restarts_fails_the_context_with_the_cause(make):
    tracker, clock, events, fatal = make(max_restarts=3)
    assert tracker.job_starting(0) is not None
    assert register(tracker, 0, where(tracker))
    for _ in range(3):  # three restarts are allowed
        clock.advance(1_000)
        assert fail_in_task(tracker) is True
    assert fatal.errors == []
    clock.advance(1_000)
    tracker.handle(m.DeregisterReceiver(0, "cannot listen on 127.0.0.1:8080: in use", "tb"))
    (error,) = fatal.errors
    assert isinstance(error, ReceiverError)
    text = str(error)
    assert "receiver 0 (Quiet-0) failed 4 times within 60s" in text
    assert "spark.receivers.receiver.maxRestarts=3" in text
    assert "spark.receivers.receiver.restartWindow=60s" in text
    assert text.endswith("last failure: cannot listen on 127.0.0.1:8080: in use")
    # ... reported in the listener, and the receiver is not run again.
    # started, 3 x (error, stopped, started), error, stopped, error: wait for them all (the
    # bus delivers them on its own thread; waiting for fewer raced with the last ones)
    kind, info = events.wait(13)[-1]
    assert kind == "error" and info.last_error_message == text
    assert tracker.receiver_statuses()[0].last_error_message == text
    assert register(tracker, 0, where(tracker)) is False
    assert tracker.job_starting(0) is None


def test_a_receiver_stopped_for_good_fails_the_context_at_once_and_never_runs_again(make):
    """A bad record under bad_record_policy=fail (issue 36): no restarts to wait through."""
    tracker, _, events, fatal = make(max_restarts=20)
    assert tracker.job_starting(0) is not None
    assert register(tracker, 0, where(tracker))
    why = "bad record: entry 1-0 of stream 's': field 'value' is not UTF-8"
    tracker.handle(
        m.DeregisterReceiver(0, why, f"Traceback ...\nBadRecordError: {why}", bad_record=True)
    )
    (error,) = fatal.errors  # the first one, not the 21st
    assert isinstance(error, BadRecordError)
    assert str(error) == (
        "receiver 0 (Quiet-0) stopped for good (bad_record_policy=fail) and is not restarted: "
        + why
    )
    assert tracker.receiver_statuses()[0].last_error_message == str(error)
    assert register(tracker, 0, where(tracker)) is False
    assert tracker.job_starting(0) is None
    kind, info = events.wait(4)[-1]  # started, error, stopped, error
    assert kind == "error" and info.last_error_message == str(error)


def test_failures_spread_wider_than_the_window_are_a_healthy_job_whose_source_blips(make):
    tracker, clock, _, fatal = make(max_restarts=2, window_ms=60_000)
    tracker.job_starting(0)
    register(tracker, 0, where(tracker))
    for _ in range(10):
        clock.advance(30_001)  # at most two failures in any 60 s
        assert fail_in_task(tracker) is True
    assert fatal.errors == []


def test_a_stop_with_an_error_and_its_failed_job_count_once(make):
    tracker, clock, _, fatal = make(max_restarts=1)
    for attempt in range(2):
        assert tracker.job_starting(0) is not None
        register(tracker, 0, where(tracker))
        clock.advance(100)
        # bad_record_policy="fail": the receiver stops with its error, then its task fails
        tracker.handle(m.DeregisterReceiver(0, "bad record: not UTF-8", "tb"))
        tracker.job_ended(0, "ReceiverError: receiver 0 stopped: bad record", "tb")
        assert len(fatal.errors) == attempt  # one failure per attempt, not two
    assert "last failure: bad record: not UTF-8" in str(fatal.errors[0])
    assert tracker.restart_receiver(0) is not None  # the launcher asks: it may not run
    assert tracker.job_starting(0) is None


def test_a_job_that_fails_before_registering_counts_too(make):
    tracker, clock, _, fatal = make(max_restarts=2)
    for _ in range(3):
        assert tracker.job_starting(0) is not None
        clock.advance(2_000)
        tracker.job_ended(0, "PythonException: ModuleNotFoundError: No module named 'x'", "tb")
    (error,) = fatal.errors
    assert "failed 3 times" in str(error) and "No module named 'x'" in str(error)


def test_clean_stops_and_stopping_are_not_failures(make):
    tracker, _, _, fatal = make(max_restarts=0)
    tracker.job_starting(0)
    register(tracker, 0, where(tracker))
    tracker.handle(m.DeregisterReceiver(0, "Stopped by driver", ""))  # no error
    tracker.job_ended(0, "")
    assert register(tracker, 0, where(tracker)) is True
    tracker.stop_receivers()
    tracker.handle(m.DeregisterReceiver(0, "stopped while the context stops", "tb"))
    assert fatal.errors == []


def test_no_limit_with_minus_one(make):
    tracker, clock, _, fatal = make(max_restarts=-1)
    register(tracker, 0, where(tracker))
    for _ in range(200):
        clock.advance(10)
        assert fail_in_task(tracker) is True
    assert fatal.errors == []


def test_counter_window_and_dedup():
    counter = RestartCounter(RestartPolicy(max_restarts=2, window_ms=1_000))
    assert counter.failed(0) is False
    assert counter.failed(1) is False  # still the same failure: not running again yet
    counter.running()
    assert counter.failed(500) is False
    counter.running()
    assert counter.failed(1_000) is False  # the one at 0 left the window
    counter.running()
    assert counter.failed(1_400) is True
    assert counter.gave_up and counter.recent == 3


def test_config_keys_and_their_checks():
    cfg = StreamingConfig.from_spark_conf(
        {
            "spark.receivers.receiver.maxRestarts": "-1",
            "spark.receivers.receiver.restartWindow": "2min",
        }
    )
    assert RestartPolicy.of(cfg) == RestartPolicy(-1, 120_000)
    assert RestartPolicy.of(StreamingConfig()) == RestartPolicy(20, 600_000)
    with pytest.raises(ConfigError, match=r"maxRestarts.*-1 for no limit, got -2"):
        StreamingConfig(receiver_max_restarts=-2)
    with pytest.raises(ConfigError, match=r"restartWindow.*> 0"):
        StreamingConfig(receiver_restart_window_s=0)


def test_a_failed_job_is_summarized_by_the_python_exception_that_ended_it():
    text = (
        "An error occurred while calling o57.collect.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed: "
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
        "thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "/x/worker.py", line 4197, in invoke_udf\n'
        "    func = read_command(pickleSer)\n"
        "ModuleNotFoundError: No module named 'pyarrow'\n"
        " SQLSTATE: 38000\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handle(PythonRunner.scala:1097)\n"
    )
    summary = summarize_failure(RuntimeError(text))
    assert summary.startswith("ModuleNotFoundError: No module named 'pyarrow' (from: org.apache")
    assert len(summary) <= 300
    assert (
        summarize_failure(RuntimeError("An error occurred while calling o1.x.\n: boom")) == "boom"
    )
