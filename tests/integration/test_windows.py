"""Windowed streams on real local Spark, against Spark's semantics, with a manual clock.

Every batch holds a known round of lines (``windows_harness.Rounds``); the test computes
what each window must hold from the batches it saw, and checks every slide against it.
"""

from __future__ import annotations

import operator
import sys
import threading
from collections import Counter

import pytest
from pyspark import cloudpickle
from windows_harness import LineFeed, drive

from spark_receivers import ConfigError, StreamingContext
from spark_receivers.receivers import SocketTextReceiver
from spark_receivers.util.clock import ManualClock

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

INTERVAL = 1000
START = 100_500  # first batch 101_000, so Spark's zero time is 100_000


def _rounds(n: int) -> list[list[str]]:
    # Round k: k+1 lines over a few words, so counts rise and fall as rounds leave windows.
    return [[f"w{(k * 7 + i) % 5}" for i in range(k % 4 + 1)] for k in range(n)]


class Collect:
    def __init__(self) -> None:
        self.by_time: dict[int, list] = {}
        self.lock = threading.Lock()

    def __call__(self, df, t: int) -> None:
        rows = [tuple(r) for r in df.collect()]
        with self.lock:
            self.by_time[t] = rows


def _context(spark, clock: ManualClock, feed: LineFeed, checkpoint_dir=None):
    ssc = StreamingContext(spark, INTERVAL, checkpoint_dir=checkpoint_dir, clock=clock)
    lines = ssc.receiver_stream(SocketTextReceiver("127.0.0.1", feed.port))
    return ssc, lines


def test_window_holds_the_batches_of_its_length_at_each_slide(spark):
    clock, feed = ManualClock(START), LineFeed()
    ssc, lines = _context(spark, clock, feed)
    batches, windows = Collect(), Collect()
    lines.foreach_batch(batches)
    lines.window(3 * INTERVAL, 2 * INTERVAL).foreach_batch(windows)
    times = drive(ssc, clock, feed, _rounds(8))
    assert times[0] == 101_000
    # Spark's WindowedDStream: fires where (t - zeroTime) is a multiple of the slide,
    # zeroTime being the batch time before the first batch; holds (t - length, t].
    zero = times[0] - INTERVAL
    expected_times = [t for t in times if (t - zero) % (2 * INTERVAL) == 0]
    assert sorted(windows.by_time) == expected_times == [102_000, 104_000, 106_000, 108_000]
    for w in expected_times:
        inside = [t for t in times if w - 3 * INTERVAL < t <= w]
        expected = Counter(r for t in inside for r in batches.by_time[t])
        assert Counter(windows.by_time[w]) == expected, (w, inside)
    # The first window holds the two batches since the start; later ones three.
    assert len(windows.by_time[102_000]) == len(batches.by_time[101_000]) + len(
        batches.by_time[102_000]
    )


def test_reduce_by_key_and_window_incremental_equals_full_recompute(spark):
    clock, feed = ManualClock(START), LineFeed()
    ssc, lines = _context(spark, clock, feed)
    pairs = lines.transform(lambda df: df.selectExpr("value AS key", "1L AS value"))
    length, slide = 3 * INTERVAL, INTERVAL
    incremental, no_inverse, full, counts = Collect(), Collect(), Collect(), Collect()
    reduced = pairs.reduce_by_key_and_window(operator.add, operator.sub, length, slide)
    reduced.foreach_batch(incremental)
    pairs.reduce_by_key_and_window(operator.add, None, length, slide).foreach_batch(no_inverse)
    pairs.window(length, slide).transform(lambda df: df.groupBy("key").sum("value")).foreach_batch(
        full
    )
    lines.count_by_window(length, slide).foreach_batch(counts)
    times = drive(ssc, clock, feed, [*_rounds(7), [], [], []])
    assert sorted(incremental.by_time) == times
    for t in times:
        recomputed = {k: v for k, v in full.by_time[t]}
        # Spark keeps a key whose count fell to 0 unless a filter drops it.
        got = {k: v for k, v in incremental.by_time[t] if v != 0}
        assert got == recomputed, t
        assert dict(no_inverse.by_time[t]) == recomputed, t
        assert counts.by_time[t] == [(sum(recomputed.values()),)], t
    # Three empty rounds at the end: every word left the window.
    assert full.by_time[times[-1]] == []
    assert {v for _, v in incremental.by_time[times[-1]]} == {0}
    # The state moved one slide at a time, never recomputed from the start.
    assert reduced.states_computed == len(times)
    # Each batch's progress reports the incremental window's state (its keys after the
    # slide); the reduce without an inverse keeps no state and is not a state operator.
    progress = {p.batch_time_ms: p.to_dict() for p in ssc.recent_progress}
    for t in times:
        ops = progress[t]["stateOperators"]
        assert [o["operatorName"] for o in ops] == ["reduce_by_key_and_window"], t
        assert ops[0]["numRowsTotal"] == len(incremental.by_time[t]), t
        assert ops[0]["allUpdatesTimeMs"] >= 0, t


def test_filter_fn_drops_keys_and_durations_are_checked(spark):
    ssc = StreamingContext(spark, INTERVAL, clock=ManualClock(START))
    lines = ssc.receiver_stream(SocketTextReceiver("127.0.0.1", 9))
    with pytest.raises(ConfigError, match=r"length_ms=2500 is not a multiple of the batch"):
        lines.window(2500, 1000)
    with pytest.raises(ConfigError, match=r"slide_ms=1500 is not a multiple of the batch"):
        lines.window(3000, 1500)
    w = lines.window(2000)
    with pytest.raises(
        ConfigError, match="a window or state over a windowed or stateful stream is not supported"
    ):
        w.transform(lambda df: df).window(4000)
    with pytest.raises(ConfigError, match="filter_fn only applies with inv_reduce_fn"):
        lines.reduce_by_key_and_window(operator.add, None, 2000, filter_fn=bool)
