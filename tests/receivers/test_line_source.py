"""The line server of the demo and the benchmarks: exact counts, fixed-size lines, in order."""

from __future__ import annotations

import socket
import threading

import pytest
from waiting import wait_until

from spark_receivers.errors import ConfigError, StateError
from spark_receivers.receivers.line_source import LineSource, LineSourceState
from spark_receivers.receivers.lines import (
    BLOCK_LINES,
    LINE_BYTES,
    LINE_WORDS,
    LinePool,
    parse_seq,
)

WAIT_S = 30


def read_all(port: int) -> list[bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s, s.makefile("rb") as f:
        return list(f)


def read_window(server: LineSource) -> list[bytes]:
    """Read every line ``server`` sends in its window, on another thread, until it finishes."""
    result: list[list[bytes]] = []
    reader = threading.Thread(target=lambda: result.append(read_all(server.port)))
    reader.start()
    assert server.wait_finished(WAIT_S)
    reader.join(WAIT_S)
    return result[0]


def check_stream(lines: list[bytes], lines_sent: int) -> None:
    assert len(lines) == lines_sent
    assert all(len(line) == LINE_BYTES and line.endswith(b"\n") for line in lines)
    assert [parse_seq(line) for line in lines] == list(range(lines_sent))


def test_pool_lines_are_fixed_size_words_from_the_vocabulary():
    pool = LinePool(vocab_size=1000, seed=7)
    vocab = set(pool.vocabulary)
    assert len(vocab) == 1000
    for seq in [0, 1, 999, 1000, 123_456_789, 9_999_999_999]:
        line = pool.line(seq)
        assert len(line) == LINE_BYTES
        seq_token, *words = line.decode().rstrip("\n").split(" ")
        assert int(seq_token) == seq and len(seq_token) == 10
        assert words and set(words) <= vocab
    assert LinePool(seed=7).line(5) == pool.line(5)  # seeded: same content every run


def test_paced_rate_sends_exact_counts_in_order():
    with LineSource(rate=10_000, seconds=1.0) as server:
        lines = read_window(server)
    info = server.info()
    assert info.error is None and info.connections == 1 and not info.torn_line
    assert 5_000 <= info.lines_sent <= 15_000
    check_stream(lines, info.lines_sent)
    # Every sent line has a send time, non-decreasing in the sequence number.
    times = [server.send_time_of(s) for s in range(0, info.lines_sent, 97)]
    assert times == sorted(times)
    assert info.started_at_s is not None and info.ended_at_s is not None
    assert info.started_at_s <= times[0] and times[-1] <= info.ended_at_s
    with pytest.raises(ValueError):
        server.send_time_of(info.lines_sent)


def test_flat_out_crosses_blocks_and_counts_exactly():
    with LineSource(rate=None, seconds=0.3) as server:
        lines = read_window(server)
    info = server.info()
    assert info.lines_sent > 2 * BLOCK_LINES
    check_stream(lines, info.lines_sent)


def test_slow_reader_pushes_back_and_counts_only_whole_lines():
    # A client that reads nothing until the window closes: the kernel buffers fill, the
    # server stops short of rate * seconds, and what it counts is exactly what arrives.
    with LineSource(rate=2_000_000, seconds=0.5, close_grace_s=0.1) as server:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
        assert server.wait_finished(WAIT_S)
        with s, s.makefile("rb") as f:
            lines = list(f)
    info = server.info()
    assert info.lines_sent < 1_000_000
    if info.torn_line:  # the window closed mid-line and the stalled reader could not take the rest
        assert 0 < len(lines[-1]) < LINE_BYTES and not lines[-1].endswith(b"\n")
        lines = lines[:-1]
    check_stream(lines, info.lines_sent)


def test_no_client_finishes_with_an_error_and_stop_is_idempotent():
    server = LineSource(rate=1000, seconds=1.0, accept_timeout_s=0.2).start()
    assert not server.wait_connected(WAIT_S)
    assert server.wait_finished(WAIT_S)
    assert server.state is LineSourceState.FINISHED
    assert "no client connected" in (server.info().error or "")
    server.stop()
    server.stop()
    with pytest.raises(RuntimeError, match="FINISHED"):
        server.start()


def test_stop_ends_the_window_early():
    with LineSource(rate=1000, seconds=600) as server:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
        assert server.wait_connected(WAIT_S)
        server.stop()
        assert server.wait_finished(WAIT_S)
        with s, s.makefile("rb") as f:
            lines = list(f)
    check_stream(lines, server.info().lines_sent)


@pytest.mark.parametrize(
    "kwargs",
    [{"rate": 0, "seconds": 1}, {"rate": 10, "seconds": 0}, {"rate": None, "seconds": 1e9}],
)
def test_invalid_config_names_the_key(kwargs):
    with pytest.raises(ValueError, match=r"rate|seconds"):
        LineSource(**kwargs)


def test_stepped_rates_split_the_stream_by_step():
    steps = [(2_000, 0.5), (20_000, 0.5)]
    with LineSource.stepped(steps) as server:
        lines = read_window(server)
    info = server.info()
    assert info.error is None and info.seconds == 1.0
    check_stream(lines, info.lines_sent)
    assert info.started_at_s is not None
    assert server.step_window(0) == (0.0, 0.5) and server.step_window(1) == (0.5, 1.0)
    boundary = server.lines_sent_by(info.started_at_s + 0.5)
    assert server.lines_sent_by(info.started_at_s) == 0
    assert server.lines_sent_by(info.started_at_s + 5) == info.lines_sent
    # The first step's rate, then ten times as much: the second step does not catch up on
    # the first (its lines are due from where the first ended).
    assert 500 <= boundary <= 1_500
    assert 7_000 <= info.lines_sent - boundary <= 11_500
    with pytest.raises(ValueError, match="index"):
        server.step_window(2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate": 10, "seconds": 1, "steps": [(10, 1)]},
        {"rate": None, "seconds": 2, "steps": [(10, 1)]},
        {"rate": None, "seconds": 1, "steps": [(0, 1)]},
    ],
)
def test_invalid_steps_are_refused(kwargs):
    with pytest.raises(ValueError, match="step"):
        LineSource(**kwargs)


def test_an_open_ended_source_serves_the_words_given_until_finished():
    """The demo's use: no window, its own words, every line counted when it finishes."""
    with LineSource(rate=20_000, words=LINE_WORDS) as source:
        s = socket.create_connection((source.host, source.port), timeout=WAIT_S)
        with s, s.makefile("rb") as f:
            first = [f.readline() for _ in range(3_000)]  # past a few ticks of the pacing
            # The writer counts a write once the kernel took it; this thread can read the
            # lines before the writer's thread runs again (it did beside a CPU hog, 2026-11-28).
            assert wait_until(lambda: source.lines_sent >= 3_000, WAIT_S), source.lines_sent
            sent = source.finish()
            lines = first + list(f)
    assert source.state is LineSourceState.FINISHED and source.info().error is None
    check_stream(lines, sent)
    vocabulary = set(LINE_WORDS)
    assert all(set(line.decode().split()[1:]) <= vocabulary for line in lines)
    with pytest.raises(StateError, match="keeps no send times"):
        source.send_time_of(0)


def test_words_must_end_every_line_at_its_size():
    words = ["spark", "stream", "block", "driver", "receiver", "partition", "log", "rate"]
    words.append("shuffle")
    with pytest.raises(ConfigError, match="none of \\[2\\]"):
        LinePool(words=words)  # nothing of 2 letters: a line 3 bytes short could not end
    assert len(LinePool(words=[*words, "io"]).line(7)) == LINE_BYTES
