"""The listener bus: typed events, each delivered to its listener method by its type."""

from __future__ import annotations

import dataclasses

import pytest

from spark_receivers.driver.observe import listener as events
from spark_receivers.driver.observe.listener import ListenerBus, StreamingListener

# In the order of events.EVENT_TYPES: the method each event type calls.
METHODS = [
    "on_streaming_started",
    "on_receiver_started",
    "on_receiver_error",
    "on_receiver_stopped",
    "on_batch_submitted",
    "on_batch_started",
    "on_batch_completed",
    "on_output_operation_started",
    "on_output_operation_completed",
    "on_block_lost",
    "on_replication_changed",
    "on_batch_progress",
]


def test_every_callback_has_one_event_type():
    callbacks = {name for name in vars(StreamingListener) if name.startswith("on_")}
    assert len(events.EVENT_TYPES) == len(METHODS) == len(callbacks)
    assert set(METHODS) == callbacks
    for event_type in events.EVENT_TYPES:
        params = event_type.__dataclass_params__
        assert params.frozen, event_type


def test_each_event_reaches_its_method_in_order():
    calls: list[tuple[str, object]] = []

    class Recording(StreamingListener):
        pass

    for name in METHODS:
        setattr(Recording, name, lambda self, payload, name=name: calls.append((name, payload)))
    payloads = [object() for _ in events.EVENT_TYPES]
    bus = ListenerBus()
    bus.add(Recording())
    bus.start()
    for event_type, payload in zip(events.EVENT_TYPES, payloads, strict=True):
        (field,) = dataclasses.fields(event_type)
        bus.post(event_type(**{field.name: payload}))
    bus.stop()
    assert calls == list(zip(METHODS, payloads, strict=True))


def test_a_listener_that_raises_does_not_stop_the_others():
    seen: list[int] = []

    class Raising(StreamingListener):
        def on_streaming_started(self, time_ms: int) -> None:
            raise RuntimeError("boom")

    class Counting(StreamingListener):
        def on_streaming_started(self, time_ms: int) -> None:
            seen.append(time_ms)

    bus = ListenerBus()
    bus.add(Raising())
    bus.add(Counting())
    bus.start()
    bus.post(events.StreamingStarted(5))
    bus.post(events.StreamingStarted(6))
    bus.stop()
    assert seen == [5, 6]


def test_an_event_name_is_refused_with_what_to_post():
    bus = ListenerBus()
    with pytest.raises(TypeError, match=r"StreamingListenerEvent.*not 'on_batch_completed'"):
        bus.post("on_batch_completed")  # type: ignore[arg-type]
