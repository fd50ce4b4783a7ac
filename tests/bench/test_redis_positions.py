"""The Redis-fed ladder's feed (a real redis-server and load generator) and its verdict."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.redis_positions import STREAM, RedisFeed, main, render, round_bounds
from spark_receivers.receivers.line_source import LineSource


def _xlen(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"XLEN {STREAM}\r\n".encode())
        reply = s.recv(64)
    assert reply.startswith(b":"), reply
    return int(reply[1:].split(b"\r\n")[0])


def test_the_feed_passes_every_line_of_the_load_generator_on_to_the_stream():
    feed = RedisFeed(positions=True)
    try:
        with LineSource(rate=5000, seconds=1.0) as source:
            feed.open(source.host, source.port)
            assert source.wait_finished(30)
            sent = source.info().lines_sent
        assert sent > 0
        deadline = time.monotonic() + 30
        while feed.lines_fed < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        assert feed.lines_fed == sent
        while _xlen(feed.port) < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _xlen(feed.port) == sent
        assert feed.receiver().__class__.__name__ == "RedisStreamReceiver"
    finally:
        report = feed.close()
    assert report == {
        "positions": True,
        "lines_fed": sent,
        "error_replies": 0,
        "feed_error": None,
    }
    assert RedisFeed(positions=False).close()["positions"] is False


def _session(round_: int, system: str, held: int, failed: int | None) -> dict:
    steps = [{"offered_rate": held, "sustained": True, "extra": {"load_1m": 2.0}}]
    if failed is not None:
        steps.append({"offered_rate": failed, "sustained": False, "extra": {"load_1m": 3.0}})
    return {"round": round_, "system": system, "steps": steps}


def test_each_round_gives_the_range_its_rungs_allow():
    sessions = [
        _session(1, "redis_positions", 60_800, 76_000),
        _session(1, "redis_no_positions", 48_700, 60_800),
        _session(2, "redis_no_positions", 60_800, 76_000),
        _session(2, "redis_positions", 60_800, None),  # held every rung: no upper end
    ]
    bounds = round_bounds(sessions)
    assert bounds[1] == [1.0, pytest.approx(76_000 / 48_700)]
    assert bounds[2] == [pytest.approx(60_800 / 76_000), None]
    table = render(sessions)
    assert "| 2 | redis_positions | 60,800 | not reached | 2.00-2.00 |" in table
    assert "round 1: [1.00, 1.56]; round 2: [0.80, ?]" in table


def test_a_spacing_that_does_not_climb_is_refused_before_any_session(capsys):
    with pytest.raises(SystemExit):
        main(["--spacing", "1.0"])
    assert "--spacing must be > 1, got 1.0" in capsys.readouterr().err
