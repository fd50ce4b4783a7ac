"""State by key across batches on real local Spark: timeouts, checkpoints, a driver restart.

Each batch holds a known round of lines (``windows_harness.Rounds``, a manual clock); the
state the stream gives after every batch is checked against one computed here.
"""

from __future__ import annotations

import os
import sys
import threading

import pandas as pd
import pytest
from pyspark import cloudpickle
from windows_harness import LineFeed, Rounds

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


class States:
    def __init__(self) -> None:
        self.by_time: dict[int, dict] = {}
        self.lock = threading.Lock()

    def __call__(self, df, t: int) -> None:
        rows = {r["key"]: r["n"] for r in df.collect()}
        with self.lock:
            self.by_time[t] = rows


def test_update_state_by_key_with_a_timeout_matches_the_reference(spark):
    clock, feed = ManualClock(START), LineFeed()
    ssc = StreamingContext(spark, INTERVAL, clock=clock)
    words = ssc.receiver_stream(SocketTextReceiver("127.0.0.1", feed.port)).transform(
        lambda df: df.withColumnRenamed("value", "key")
    )
    plain, timed = States(), States()
    words.update_state_by_key(count_words, "key", "key string, n bigint").foreach_batch(plain)
    words.update_state_by_key(
        count_words, "key", "key string, n bigint", timeout_ms=2 * INTERVAL
    ).foreach_batch(timed)
    ssc.start()
    try:
        rounds = Rounds(ssc, clock, feed)
        for lines in ROUNDS:
            rounds.run(lines)
    finally:
        ssc.stop(graceful=False)
        feed.close()
    assert sorted(plain.by_time.items()) == reference(ROUNDS)
    assert sorted(timed.by_time.items()) == reference(ROUNDS, timeout_ms=2 * INTERVAL)
    # "b" got nothing after 102_000: gone at 104_000 with a 2 s timeout, kept without one.
    assert "b" not in timed.by_time[104_000] and timed.by_time[103_000]["b"] == 2
    assert plain.by_time[110_000]["b"] == 2


def test_state_after_a_driver_restart_equals_an_uninterrupted_run(spark, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    feed = LineFeed()
    states = States()
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
            return ssc

        return make

    first_run, second_run = ROUNDS[:5], ROUNDS[5:]
    clock = ManualClock(START)
    ssc = StreamingContext.get_or_create(checkpoint, create(clock))
    ssc.start()
    try:
        rounds = Rounds(ssc, clock, feed)
        last = [rounds.run(lines) for lines in first_run][-1]
    finally:
        ssc.stop(graceful=False)  # the driver goes away after batch 105_000
    assert last == 105_000
    saved = sorted(os.listdir(os.path.join(checkpoint, "state", "window-0")))
    assert saved == ["state-102000.arrow", "state-104000.arrow"]  # every 2 batches

    feed.reconnected()
    clock = ManualClock(last + 500)
    ssc = StreamingContext.get_or_create(checkpoint, create(clock))
    assert ssc.recovered_from_checkpoint
    ssc.start()
    try:
        rounds = Rounds(ssc, clock, feed)
        for lines in second_run:
            rounds.run(lines)
    finally:
        ssc.stop(graceful=False)
        feed.close()
    assert sorted(states.by_time.items()) == reference(ROUNDS)
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
