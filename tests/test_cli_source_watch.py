"""``ingest --unreachable-timeout``: when an unreachable source server ends a run (no Spark).

The probe, the clocks and the receiver's status are given by the test: the rules are
checked step by step, without waiting.
"""

from __future__ import annotations

import socket

import pytest

from spark_receivers.cli.source_watch import SourceWatch, unreachable
from spark_receivers.driver.observe.status import ReceiverStatus

SERVER = ("127.0.0.1", 6390)
START_MS = 1_700_000_000_000


class World:
    """A server that is up or down, and clocks that move only when told."""

    def __init__(self) -> None:
        self.down = "Connection refused"
        self.now_s = 100.0
        self.probes = 0

    def probe(self, host: str, port: int) -> str | None:
        assert (host, port) == SERVER
        self.probes += 1
        return self.down

    def wall_ms(self) -> int:
        return START_MS + round((self.now_s - 100.0) * 1000)

    def watch(self, timeout_s: float = 10.0) -> SourceWatch:
        return SourceWatch(
            SERVER, timeout_s, probe=self.probe, monotonic=lambda: self.now_s, wall_ms=self.wall_ms
        )


def receiver(records: int = 0, error_at_ms: int = -1, error: str = "") -> ReceiverStatus:
    return ReceiverStatus(
        stream_id=0, name="RedisStreamReceiver-0", state="INACTIVE", executor_id=None,
        host=None, endpoint=None, records=records, blocks=0, jobs=1,
        last_error_message=error, last_error_time_ms=error_at_ms,
    )  # fmt: skip


REFUSED = "Error 111 connecting to 127.0.0.1:6390. Connection refused."


def test_a_server_down_with_the_receiver_failing_ends_the_run_after_the_timeout():
    world = World()
    watch = world.watch(timeout_s=10.0)
    assert watch.check(receiver(error_at_ms=START_MS + 200, error=REFUSED)) is None
    world.now_s += 9.9
    failing = receiver(error_at_ms=world.wall_ms() - 100, error=REFUSED)
    assert watch.check(failing) is None  # not yet
    world.now_s += 0.1
    reason = watch.check(failing)
    assert reason == (
        "the source's server 127.0.0.1:6390 has been unreachable for 10s (Connection refused); "
        f"the receiver's last error: {REFUSED}"
    )


def test_a_server_that_comes_back_starts_the_count_again():
    world = World()
    watch = world.watch(timeout_s=10.0)
    failing = receiver(error_at_ms=START_MS, error=REFUSED)
    assert watch.check(failing) is None
    world.now_s += 8
    world.down = None  # back up
    assert watch.check(failing) is None
    world.down = "Connection refused"
    world.now_s += 1
    assert watch.check(failing) is None  # a new streak starts here
    world.now_s += 9.5
    assert watch.check(receiver(error_at_ms=world.wall_ms(), error=REFUSED)) is None
    world.now_s += 0.5
    assert watch.check(receiver(error_at_ms=world.wall_ms(), error=REFUSED)) is not None


def test_records_coming_in_mean_the_source_works_for_the_receiver():
    world = World()
    watch = world.watch(timeout_s=10.0)
    assert watch.check(receiver(records=5, error_at_ms=START_MS, error=REFUSED)) is None
    world.now_s += 20
    # unreachable from here, but the receiver keeps storing: not the end of the run
    assert watch.check(receiver(records=9, error_at_ms=START_MS, error=REFUSED)) is None
    world.now_s += 5
    assert watch.check(receiver(records=9, error_at_ms=world.wall_ms(), error=REFUSED)) is None


def test_unreachable_from_here_but_no_receiver_error_is_not_the_end():
    """A driver outside the executors' network: the receiver is fine, the probe is not."""
    world = World()
    watch = world.watch(timeout_s=10.0)
    assert watch.check(receiver()) is None
    world.now_s += 60
    assert watch.check(receiver()) is None
    old_error = receiver(error_at_ms=START_MS - 3_600_000, error="a blip an hour ago")
    assert watch.check(old_error) is None
    assert watch.down_at_stop(old_error) is None


def test_down_when_the_run_stops_is_reported_even_before_the_timeout():
    world = World()
    watch = world.watch(timeout_s=120.0)
    assert watch.check(receiver(error_at_ms=START_MS, error=REFUSED)) is None
    world.now_s += 8
    failing = receiver(error_at_ms=world.wall_ms() - 500, error=REFUSED)
    assert watch.check(failing) is None
    reason = watch.down_at_stop(failing)
    assert reason is not None and "has been unreachable for 8s (Connection refused)" in reason
    world.down = None
    assert watch.down_at_stop(failing) is None  # back up at the stop: fine


def test_never_checked_or_reachable_at_the_last_check_is_fine_at_the_stop():
    world = World()
    assert world.watch().down_at_stop(receiver(error_at_ms=START_MS, error=REFUSED)) is None
    watch = world.watch()
    world.down = None
    assert watch.check(receiver()) is None
    world.down = "Connection refused"
    assert watch.down_at_stop(receiver(error_at_ms=START_MS, error=REFUSED)) is None


def test_a_receiver_without_recent_errors_is_never_probed():
    """A healthy run opens no connections of its own to the server (a broker logs each)."""
    world = World()
    watch = world.watch(timeout_s=5.0)
    for _ in range(100):
        world.now_s += 2
        assert watch.check(receiver(records=3)) is None
    old = receiver(records=3, error_at_ms=world.wall_ms() - 61_000, error="a blip a minute ago")
    assert watch.check(old) is None
    assert world.probes == 0
    assert watch.check(receiver(records=3, error_at_ms=world.wall_ms(), error=REFUSED)) is None
    assert world.probes == 1


def test_a_slow_backoff_keeps_the_streak_between_two_errors():
    """Errors 30 s apart (the capped backoff) are one failing receiver, not two blips."""
    world = World()
    watch = world.watch(timeout_s=5.0)
    first_error = receiver(error_at_ms=world.wall_ms(), error=REFUSED)
    assert watch.check(first_error) is None
    world.now_s += 4
    assert watch.check(first_error) is None
    world.now_s += 2
    assert watch.check(first_error) is not None  # the error is 6 s old: still failing


def test_the_probe_tells_a_listening_port_from_a_closed_one():
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert unreachable("127.0.0.1", server.getsockname()[1]) is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: refused
        assert unreachable("127.0.0.1", s.getsockname()[1]) == "Connection refused"


def test_the_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        SourceWatch(SERVER, 0)
