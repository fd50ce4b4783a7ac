"""No block carries a record longer than the limit, whatever receiver stored it (issue 36).

A row that large killed the driver's JVM (OutOfMemoryError) and every batch with it.
The built-in receivers refuse such records themselves (tests/receivers/); these tests
hold the line for any receiver, under a real supervisor.
"""

from __future__ import annotations

import itertools
import json
import threading

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_receivers import Receiver
from spark_receivers.config_checks import MAX_RECORD_BYTES_LIMIT
from spark_receivers.errors import BadRecordError, ConfigError
from spark_receivers.receiver.bad_records import split_oversize
from spark_receivers.rpc import messages as m
from spark_receivers.testing import StandInTracker, supervise

MiB = 1024 * 1024
BIG = "x" * (2 * MiB)


class Storing(Receiver):
    """Stores ``batches`` (each a list, or one record) on a thread, then idles."""

    def __init__(self, batches: list, reliable: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.batches = batches
        self.reliable = reliable
        self.raised: list[BaseException] = []

    def on_start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def on_stop(self) -> None:
        pass

    def _run(self) -> None:
        try:
            for batch in self.batches:
                self.store(batch, reliable=self.reliable)
        except BadRecordError as e:
            self.raised.append(e)


@pytest.fixture
def tracker():
    t = StandInTracker()
    yield t
    t.close()


def stored_values(tracker, sup) -> list[str]:
    return tracker.stored_table(sup).column("value").to_pylist()


@pytest.mark.parametrize("reliable", [False, True])
def test_a_record_over_the_limit_is_taken_out_of_its_block_and_set_aside(
    tracker, tmp_path, reliable
):
    receiver = Storing(
        [["a", BIG, "b"], "c"],
        reliable=reliable,
        bad_record_policy="dead_letter",
        dead_letter_dir=str(tmp_path),
    )
    sup = supervise(tracker, receiver)  # spark.receivers.receiver.maxRecordBytes: 1 MiB
    sup.start()
    try:
        tracker.wait_for(lambda: tracker.records() >= 3)
        assert sorted(stored_values(tracker, sup)) == ["a", "b", "c"]
        assert all(b.size_bytes < MiB for b in tracker.blocks())
        assert receiver.bad_records == 1
    finally:
        sup.stop("test over")
        sup.await_termination(15)
    (letters,) = tmp_path.glob("stream-0-*.jsonl")
    (letter,) = [json.loads(line) for line in letters.read_text().splitlines()]
    assert letter["reason"] == "a record of 2,097,152 bytes, longer than max_record_bytes=1,048,576"
    assert letter["bytes"] == 2 * MiB
    assert (tmp_path / letter["file"]).read_text() == BIG  # byte for byte, beside the line


@pytest.mark.parametrize("reliable", [False, True])
def test_under_fail_the_records_before_are_kept_and_the_receiver_stops_for_good(tracker, reliable):
    receiver = Storing([["a", BIG, "b"]], reliable=reliable, bad_record_policy="fail")
    sup = supervise(tracker, receiver)
    sup.start()
    with pytest.raises(Exception, match="bad record: a record of 2,097,152 bytes"):
        sup.await_termination(30)
    assert sorted(stored_values(tracker, sup)) == ["a", "b"]
    (dereg,) = tracker.of(m.DeregisterReceiver)
    assert dereg.bad_record  # the driver fails the context instead of restarting it
    assert bool(receiver.raised) is reliable  # a reliable store raises to its caller


def test_the_receivers_own_limit_wins_over_the_contexts(tracker):
    class Limited(Storing):
        max_record_bytes = 3 * MiB

    receiver = Limited([[BIG, "small"]])
    sup = supervise(tracker, receiver, receiver_max_record_bytes=MiB)
    sup.start()
    try:
        tracker.wait_for(lambda: tracker.records() >= 2)
        assert sorted(stored_values(tracker, sup)) == ["small", BIG]
    finally:
        sup.stop("test over")
        sup.await_termination(15)


@pytest.mark.parametrize("bad", [0, -1, MAX_RECORD_BYTES_LIMIT + 1, 1.5, True])
def test_the_limit_is_a_size_the_jvm_can_hold(bad):
    from spark_receivers.config import StreamingConfig
    from spark_receivers.receivers import SocketTextReceiver

    with pytest.raises(ConfigError, match="max_record_bytes"):
        StreamingConfig(receiver_max_record_bytes=bad)
    with pytest.raises(ConfigError, match="max_record_bytes must be an integer number of bytes"):
        SocketTextReceiver("h", 1, max_record_bytes=bad)


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.text(max_size=12)),
            st.one_of(st.none(), st.binary(max_size=12)),
            st.integers(-5, 5),
        ),
        max_size=30,
    ),
    st.integers(1, 20),
    st.lists(st.integers(0, 30), max_size=4),
    st.lists(st.integers(0, 30), max_size=4),
)
def test_split_oversize_keeps_exactly_the_rows_within_the_limit(rows, limit, s_cuts, b_cuts):
    def chunked(values, type_, cuts):
        # Each column chunked at its own edges, as blocks joined from many stores are.
        edges = sorted({0, len(values), *(c for c in cuts if c < len(values))})
        return pa.chunked_array(
            [pa.array(values[a:b], type_) for a, b in itertools.pairwise(edges)],
            type_,
        )

    table = pa.table(
        {
            "s": chunked([r[0] for r in rows], pa.string(), s_cuts),
            "b": chunked([r[1] for r in rows], pa.binary(), b_cuts),
            "n": pa.array([r[2] for r in rows], pa.int64()),
        }
    )

    def size(r):
        return len((r[0] or "").encode()) + len(r[1] or b"")

    kept, taken = split_oversize(table, limit)
    assert kept.to_pylist() == [{"s": r[0], "b": r[1], "n": r[2]} for r in rows if size(r) <= limit]
    assert [(t["s"], t["b"], t["n"], n) for t, n in taken] == [
        (*r, size(r)) for r in rows if size(r) > limit
    ]
