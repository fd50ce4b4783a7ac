"""State by key across batches on real local Spark: timeouts, checkpoints, a driver restart.

Each batch holds a known round of lines (``windows_harness.Rounds``, a manual clock); the
state the stream gives after every batch is checked against one computed here.
"""

from __future__ import annotations

import operator
import os
import sys
import threading

import pandas as pd
import pytest
from pyspark import cloudpickle
from windows_harness import LineFeed, drive

from spark_receivers import ConfigError, StreamingConfig, StreamingContext
from spark_receivers.receivers import SocketTextReceiver
from spark_receivers.util.clock import ManualClock

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

INTERVAL = 1000
START = 100_500  # first batch 101_000


def count_words(key, rows, state):
    """A running count per word: Spark's classic updateStateByKey example."""
    before = int(state["n"].iloc[0]) if len(state) else 0
    return pd.DataFrame({"key": [key[0]], "n": [before + len(rows)]})


ROUNDS = [["a", "b", "a"], ["b"], [], ["c", "a"], [], [], ["a"], ["d", "d"], [], []]


def reference(rounds, timeout_ms=None):
    """The state after every batch of an uninterrupted run (dict word -> count)."""
    state: dict[str, int] = {}
    updated: dict[str, int] = {}
    out = []
    for i, lines in enumerate(rounds):
        t = 101_000 + i * INTERVAL
        if timeout_ms is not None:
            for k in [k for k in state if k not in lines and updated[k] <= t - timeout_ms]:
                del state[k], updated[k]
        for k in lines:
            state[k] = state.get(k, 0) + 1
            updated[k] = t
        out.append((t, dict(state)))
    return out


def running_count(key, rows, state):
    """Spark's mapWithState example: each word seen maps to its running count."""
    before = int(state["n"].iloc[0]) if len(state) else 0
    if len(rows) == 0:  # only a key timing out is called without rows
        return None, pd.DataFrame({"key": [key[0]], "n": [before], "event": ["timed out"]})
    n = before + len(rows)
    state = pd.DataFrame({"key": [key[0]], "n": [n]})
    return state, pd.DataFrame({"key": [key[0]], "n": [n], "event": ["seen"]})


def mapped_reference(rounds, timeout_ms=None):
    """What map_with_state(running_count) gives per batch: (time, output, state after)."""
    state: dict[str, int] = {}
    updated: dict[str, int] = {}
    out = []
    for i, lines in enumerate(rounds):
        t = 101_000 + i * INTERVAL
        mapped = []
        if timeout_ms is not None:
            for k in [k for k in state if k not in lines and updated[k] <= t - timeout_ms]:
                mapped.append((k, state[k], "timed out"))
                del state[k], updated[k]
        for k in sorted(set(lines)):
            state[k] = state.get(k, 0) + lines.count(k)
            updated[k] = t
            mapped.append((k, state[k], "seen"))
        out.append((t, sorted(mapped), dict(state)))
    return out


def windowed_reference(rounds, length):
    """What reduce_by_key_and_window(add, sub, length batches) gives after every batch: each
    word seen so far with its count in the last ``length`` rounds (a word whose count fell
    to 0 stays, as in Spark without a filter)."""
    out = []
    for i in range(len(rounds)):
        seen = {k for r in rounds[: i + 1] for k in r}
        inside = [k for r in rounds[max(0, i + 1 - length) : i + 1] for k in r]
        out.append((101_000 + i * INTERVAL, {k: inside.count(k) for k in seen}))
    return out


class Mapped:
    def __init__(self) -> None:
        self.by_time: dict[int, list] = {}

    def __call__(self, df, t: int) -> None:
        self.by_time[t] = sorted((r["key"], r["n"], r["event"]) for r in df.collect())


def run_rounds(spark, build) -> StreamingContext:
    """A context on a manual clock whose stream of words (column ``key``) ``build`` uses,
    run through :data:`ROUNDS`, one batch each, then stopped."""
    clock, feed = ManualClock(START), LineFeed()
    ssc = StreamingContext(spark, INTERVAL, clock=clock)
    build(
        ssc.receiver_stream(SocketTextReceiver("127.0.0.1", feed.port)).transform(
            lambda df: df.withColumnRenamed("value", "key")
        )
    )
    drive(ssc, clock, feed, ROUNDS)
    return ssc


class States:
    def __init__(self) -> None:
        self.by_time: dict[int, dict] = {}
        self.lock = threading.Lock()

    def __call__(self, df, t: int) -> None:
        rows = {r["key"]: r["n"] for r in df.collect()}
        with self.lock:
            self.by_time[t] = rows


def test_update_state_by_key_with_a_timeout_matches_the_reference(spark):
    plain, timed = States(), States()

    def build(words):
        words.update_state_by_key(count_words, "key", "key string, n bigint").foreach_batch(plain)
        words.update_state_by_key(
            count_words, "key", "key string, n bigint", timeout_ms=2 * INTERVAL
        ).foreach_batch(timed)

    ssc = run_rounds(spark, build)
    assert sorted(plain.by_time.items()) == reference(ROUNDS)
    assert sorted(timed.by_time.items()) == reference(ROUNDS, timeout_ms=2 * INTERVAL)
    # Each batch's progress has the size of both states (keys after the batch).
    progress = {p.batch_time_ms: p.to_dict() for p in ssc.recent_progress}
    for (t, state), (_, timed_state) in zip(
        reference(ROUNDS), reference(ROUNDS, timeout_ms=2 * INTERVAL), strict=True
    ):
        ops = progress[t]["stateOperators"]
        assert [o["operatorName"] for o in ops] == ["update_state_by_key"] * 2
        assert [o["numRowsTotal"] for o in ops] == [len(state), len(timed_state)]
        assert all(o["allUpdatesTimeMs"] >= 0 and o["commitTimeMs"] == 0 for o in ops)
    # "b" got nothing after 102_000: gone at 104_000 with a 2 s timeout, kept without one.
    assert "b" not in timed.by_time[104_000] and timed.by_time[103_000]["b"] == 2
    assert plain.by_time[110_000]["b"] == 2


def test_map_with_state_maps_only_keys_with_rows_and_calls_a_timing_out_key_once(spark):
    plain, timed, snapshots = Mapped(), Mapped(), States()
    schema, out = "key string, n bigint", "key string, n bigint, event string"

    def build(words):
        words.map_with_state(running_count, "key", schema, out).foreach_batch(plain)
        mapped = words.map_with_state(running_count, "key", schema, out, timeout_ms=2 * INTERVAL)
        mapped.foreach_batch(timed)
        mapped.state_snapshots().foreach_batch(snapshots)

    run_rounds(spark, build)
    want, want_timed = mapped_reference(ROUNDS), mapped_reference(ROUNDS, 2 * INTERVAL)
    assert sorted(plain.by_time.items()) == [(t, mapped) for t, mapped, _ in want]
    assert sorted(timed.by_time.items()) == [(t, mapped) for t, mapped, _ in want_timed]
    assert sorted(snapshots.by_time.items()) == [(t, state) for t, _, state in want_timed]
    # "a" got no rows at 102_000 and 103_000: called once more, timing out, at 103_000;
    # "b" (rows at 102_000) at 104_000. Without a timeout a key without rows is not called.
    assert timed.by_time[103_000] == [("a", 2, "timed out")]
    assert ("b", 2, "timed out") in timed.by_time[104_000]
    assert plain.by_time[103_000] == []
    assert plain.by_time[104_000] == [("a", 3, "seen"), ("c", 1, "seen")]


def test_state_after_a_driver_restart_equals_an_uninterrupted_run(spark, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    feed = LineFeed()
    states, mapped, windowed = States(), Mapped(), States()
    made: list = []

    def create(clock):
        def make():
            ssc = StreamingContext(
                spark,
                INTERVAL,
                checkpoint_dir=checkpoint,
                config=StreamingConfig(receiver_wal_enabled=True),
                clock=clock,
            )
            words = ssc.receiver_stream(SocketTextReceiver("127.0.0.1", feed.port)).transform(
                lambda df: df.withColumnRenamed("value", "key")
            )
            state = words.update_state_by_key(count_words, "key", "key string, n bigint")
            state.checkpoint(2 * INTERVAL).foreach_batch(states)
            made.append(state)
            out = "key string, n bigint, event string"
            words.map_with_state(running_count, "key", "key string, n bigint", out).checkpoint(
                2 * INTERVAL
            ).foreach_batch(mapped)
            counts = words.transform(lambda df: df.selectExpr("key", "1L AS n"))
            counts.reduce_by_key_and_window(
                operator.add, operator.sub, 3 * INTERVAL, key="key", value="n"
            ).checkpoint(2 * INTERVAL).foreach_batch(windowed)
            return ssc

        return make

    first_run, second_run = ROUNDS[:5], ROUNDS[5:]
    clock = ManualClock(START)
    ssc = StreamingContext.get_or_create(checkpoint, create(clock))
    last = drive(ssc, clock, feed, first_run, close_feed=False)[-1]  # then the driver goes
    assert last == 105_000
    progress = {p.batch_time_ms: p.to_dict() for p in ssc.recent_progress}
    for t in (102_000, 104_000):  # saved at these batches, with the bytes it took
        ops = progress[t]["stateOperators"]
        assert [o["operatorName"] for o in ops] == [
            "update_state_by_key",
            "map_with_state",
            "reduce_by_key_and_window",
        ]
        assert all(o["customMetrics"]["savedBytes"] > 0 for o in ops), ops
    saved_at_103 = [o["customMetrics"]["savedBytes"] for o in progress[103_000]["stateOperators"]]
    assert saved_at_103 == [0, 0, 0]
    # update_state_by_key's, map_with_state's, reduce_by_key_and_window's
    for name in ("window-0", "window-1", "window-2"):
        saved = sorted(os.listdir(os.path.join(checkpoint, "state", name)))
        assert saved == ["state-102000.arrow", "state-104000.arrow"]  # every 2 batches

    feed.reconnected()
    clock = ManualClock(last + 500)
    ssc = StreamingContext.get_or_create(checkpoint, create(clock))
    assert ssc.recovered_from_checkpoint
    drive(ssc, clock, feed, second_run)
    assert sorted(states.by_time.items()) == reference(ROUNDS)
    assert sorted(mapped.by_time.items()) == [(t, m) for t, m, _ in mapped_reference(ROUNDS)]
    # The window's state was loaded at 104_000 too; its slides at 105_000 (the new one and
    # the one leaving, 102_000) were read again from their blocks.
    assert sorted(windowed.by_time.items()) == windowed_reference(ROUNDS, 3)
    # The restarted driver loaded the state of 104_000 and computed 105_000 again from
    # its blocks (read back from the receiver WAL), then one batch at a time.
    assert made[1].computed == [105_000, 106_000, 107_000, 108_000, 109_000, 110_000]


def test_update_state_by_key_checks_its_arguments(spark):
    ssc = StreamingContext(spark, INTERVAL, clock=ManualClock(START))
    lines = ssc.receiver_stream(SocketTextReceiver("127.0.0.1", 9))
    with pytest.raises(ConfigError, match=r"must hold the key columns \['word'\]"):
        lines.update_state_by_key(count_words, "word", "key string, n bigint")
    with pytest.raises(ConfigError, match="timeout_ms must be an integer"):
        lines.update_state_by_key(count_words, "key", "key string, n bigint", timeout_ms=0)
    state = lines.update_state_by_key(count_words, "key", "key string, n bigint")
    with pytest.raises(ConfigError, match="a multiple of the batch interval"):
        state.checkpoint(1500)
    with pytest.raises(ConfigError, match="map_with_state: output_schema 'key strin' is not"):
        lines.map_with_state(running_count, "key", "key string, n bigint", "key strin")
    with pytest.raises(ConfigError, match=r"map_with_state: the state_schema .* \['word'\]"):
        lines.map_with_state(running_count, "word", "key string, n bigint", "key string")
    mapped = lines.map_with_state(running_count, "key", "key string, n bigint", "key string")
    with pytest.raises(ConfigError, match=r"window of the state snapshots of .*: a window or"):
        mapped.state_snapshots().window(2 * INTERVAL)
