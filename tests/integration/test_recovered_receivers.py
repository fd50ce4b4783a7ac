"""A context restarted from a checkpoint starts its receivers before it redoes batches.

The first context fails on its first batch with records (its sink is down), so its
checkpoint has batches to redo, with blocks in the receiver WAL. The second, built by
``get_or_create``, must have its receiver ACTIVE before any batch to redo starts (the
receiver no longer waits behind them for a task slot and CPU), and still redo exactly
the logged blocks: no block of the new run in a redone batch.
"""

from __future__ import annotations

import threading

import pytest

from spark_receivers import StreamingConfig, StreamingContext, StreamingError, StreamingListener
from spark_receivers.testing import SequenceReceiver

pytestmark = pytest.mark.spark

BOUND_S = 300  # a bound on waits for events, never a verdict


class Events(StreamingListener):
    """Receiver starts and batch starts, in the order the listener bus delivers them."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.changed = threading.Condition()

    def _add(self, kind: str, value: int) -> None:
        with self.changed:
            self.seen.append((kind, value))
            self.changed.notify_all()

    def on_receiver_started(self, info) -> None:
        self._add("receiver started", info.stream_id)

    def on_batch_started(self, info) -> None:
        self._add("batch started", info.batch_time_ms)


@pytest.mark.timeout(900)  # two contexts, each with its receiver, on a loaded machine
def test_a_restarted_context_starts_its_receiver_before_the_batches_it_redoes(spark, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    config = StreamingConfig(
        receiver_wal_enabled=True,
        receiver_start_timeout_s=BOUND_S,
        warm_up_timeout_s=0,  # not what this test is about: a minute less on a busy machine
    )
    old = [f"old-{i:04d}" for i in range(1000)]
    new = [f"new-{i:04d}" for i in range(1000)]

    received = threading.Event()

    class Received(StreamingListener):
        def on_batch_submitted(self, info) -> None:  # every block is in the driver WAL
            if first.status().records_received >= len(old):
                received.set()

    def sink_down(df, batch_time_ms: int) -> None:
        # The first batch with records fails once every record is in the WAL: they are
        # all redone (a stop at once would drop blocks not reported yet).
        if df.count():
            received.wait(BOUND_S)
            raise RuntimeError("the sink is down")

    first = StreamingContext(spark, 500, checkpoint_dir=ckpt, config=config)
    first.receiver_stream(SequenceReceiver(old, mode="list", chunk=100)).foreach_batch(sink_down)
    first.add_streaming_listener(Received())
    first.start()
    with pytest.raises(StreamingError, match="the sink is down"):
        first.await_termination(timeout_s=BOUND_S)
    first.stop(graceful=False)
    assert received.is_set()

    batches: dict[int, list[str]] = {}
    done = threading.Condition()

    def keep(df, batch_time_ms: int) -> None:
        values = [r.value for r in df.collect()]
        with done:
            batches[batch_time_ms] = values
            done.notify_all()

    def create() -> StreamingContext:
        ssc = StreamingContext(spark, 500, checkpoint_dir=ckpt, config=config)
        ssc.receiver_stream(SequenceReceiver(new, mode="list", chunk=100)).foreach_batch(keep)
        return ssc

    second = StreamingContext.get_or_create(ckpt, create)
    assert second.recovered_from_checkpoint
    events = Events()
    second.add_streaming_listener(events)
    second.start()
    try:
        redone = second.status().recovered_batches_ms
        assert redone, "the checkpoint left no batch to redo"

        def everything() -> bool:
            got = [v for vs in batches.values() for v in vs]
            return set(old + new) <= set(got) and set(redone) <= set(batches)

        with done:
            assert done.wait_for(everything, BOUND_S), sorted(batches)
    finally:
        second.stop(graceful=True)
    with events.changed:
        seen = list(events.seen)
    started = seen.index(("receiver started", 0))
    first_redone = min(seen.index(("batch started", t)) for t in redone)
    assert started < first_redone, seen[: first_redone + 1]
    # The redone batches hold exactly what the first run logged: its records, once each.
    in_redone = [v for t in redone for v in batches[t]]
    assert sorted(in_redone) == old
    assert not any(v in new for t in redone for v in batches[t])
