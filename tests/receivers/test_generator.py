"""GeneratorReceiver: the numbered lines it stores, its bound and its rate."""

from __future__ import annotations

import time

import pytest
from harness import HarnessSupervisor
from waiting import wait_until

from spark_receivers.errors import ConfigError
from spark_receivers.receivers import GeneratorReceiver


def test_total_lines_exactly_as_expected_in_lists():
    receiver = GeneratorReceiver(total=2_500, chunk=1000, line_bytes=60, seed=3)
    sup = HarnessSupervisor(receiver).start()
    try:
        records = sup.wait_for(2_500)
        assert wait_until(lambda: False, 0.1) is False
        assert records == receiver.expected()
        assert len(sup.records) == 2_500  # stops at total, idles until stopped
        assert records[7].startswith("7 ") and 40 <= len(records[7]) <= 80
    finally:
        sup.shutdown()
    assert not receiver._thread.is_alive()


def test_rate_is_kept():
    receiver = GeneratorReceiver(rate=2_000, total=1_000)
    sup = HarnessSupervisor(receiver)
    started = time.monotonic()
    sup.start()
    try:
        sup.wait_for(1_000)
        elapsed = time.monotonic() - started
        assert 0.4 <= elapsed <= 2.0, elapsed
    finally:
        sup.shutdown()


def test_restart_goes_on_from_the_next_number_and_reliable_mode():
    receiver = GeneratorReceiver(rate=5_000, total=1_000, reliable=True, chunk=100)
    sup = HarnessSupervisor(receiver).start()
    try:
        sup.wait_for(200)
        sup.restart_receiver("test", None, 10)
        records = sup.wait_for(1_000)
        assert records == receiver.expected()
        assert sum(len(b) for b in sup.reliable_batches) == 1_000
    finally:
        sup.shutdown()


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="rate"):
        GeneratorReceiver(rate=0)
    with pytest.raises(ConfigError, match="total"):
        GeneratorReceiver(total=-1)
    with pytest.raises(ConfigError, match="needs n"):
        GeneratorReceiver().expected()
