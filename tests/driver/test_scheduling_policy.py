"""ReceiverSchedulingPolicy (Spark's ReceiverSchedulingPolicySuite, plus properties)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_receivers.driver.tracking.scheduling_policy import (
    ExecutorCacheTaskLocation,
    HostTaskLocation,
    ReceiverSchedulingPolicy,
    ReceiverState,
    ReceiverTrackingInfo,
    TaskLocation,
    parse_task_location,
)

policy = ReceiverSchedulingPolicy()


@dataclass(frozen=True)
class FakeReceiver:
    stream_id: int
    preferred_location: str | None = None


def executor(host: str, executor_id: int | str) -> ExecutorCacheTaskLocation:
    return ExecutorCacheTaskLocation(host, str(executor_id))


def active(receiver_id: int, on: ExecutorCacheTaskLocation) -> ReceiverTrackingInfo:
    return ReceiverTrackingInfo(receiver_id, ReceiverState.ACTIVE, None, on)


def scheduled(receiver_id: int, *locations: TaskLocation) -> ReceiverTrackingInfo:
    return ReceiverTrackingInfo(receiver_id, ReceiverState.SCHEDULED, locations, None)


def load_per_location(placement: dict[int, list[TaskLocation]]) -> Counter[TaskLocation]:
    return Counter(loc for locations in placement.values() for loc in locations)


# --- task locations -------------------------------------------------------------------


def test_task_location_strings_match_spark():
    assert str(executor("node1", 7)) == "executor_node1_7"
    assert str(HostTaskLocation("node1")) == "node1"


@pytest.mark.parametrize(
    "location",
    [
        executor("node1", 7),
        executor("10.0.0.1", "driver"),
        executor("h", "a_b"),
        HostTaskLocation("node1"),
    ],
)
def test_parse_task_location_round_trips(location):
    assert parse_task_location(str(location)) == location


def test_parse_task_location_reads_hdfs_cache_as_host():
    assert parse_task_location("hdfs_cache_node1") == HostTaskLocation("node1")


@pytest.mark.parametrize(
    "bad", ["", "executor_", "executor_node1", "executor_node1_", "executor__1"]
)
def test_parse_task_location_rejects_malformed(bad):
    with pytest.raises(ValueError, match="executor_<host>_<id>"):
        parse_task_location(bad)


def test_tracking_info_checks_its_state():
    with pytest.raises(ValueError, match="SCHEDULED"):
        ReceiverTrackingInfo(1, ReceiverState.SCHEDULED, None, None)
    with pytest.raises(ValueError, match="ACTIVE"):
        ReceiverTrackingInfo(1, ReceiverState.ACTIVE, None, None)
    info = ReceiverTrackingInfo(1, ReceiverState.INACTIVE, None, None)
    assert info.name is None and info.error_time_ms is None


# --- reschedule_receiver --------------------------------------------------------------


def test_reschedule_with_no_executors_returns_nothing():
    assert policy.reschedule_receiver(0, None, {}, executors=[]) == []
    assert policy.reschedule_receiver(0, "host1", {}, executors=[]) == []


def test_reschedule_includes_the_preferred_location():
    executors = [executor("host2", 2)]
    infos = {0: ReceiverTrackingInfo(0, ReceiverState.INACTIVE, None, None)}
    locations = policy.reschedule_receiver(0, "host1", infos, executors)
    assert locations == [HostTaskLocation("host1"), executors[0]]


def test_reschedule_returns_every_idle_executor():
    executors = [executor(f"host{i}", i) for i in range(1, 6)]
    infos = {0: active(0, executors[0])}  # executor 1 is busy, the others idle
    assert policy.reschedule_receiver(1, None, infos, executors) == executors[1:]


def test_reschedule_returns_every_minimum_weight_executor_when_none_is_idle():
    e1, e2, e3, e4, e5 = (executor(f"host{i}", i) for i in range(1, 6))
    # Weights: e1 = 1.5, e2 = 0.5, e3 = 1.0, e4 = 0.5, e5 = 0.5
    infos = {
        0: active(0, e1),
        1: scheduled(1, e2, e3),
        2: scheduled(2, e1, e3),
        3: scheduled(4, e4, e5),
    }
    locations = policy.reschedule_receiver(4, None, infos, [e1, e2, e3, e4, e5])
    assert locations == [e2, e4, e5]


def test_reschedule_ignores_inactive_receivers_and_counts_host_candidates_in_the_share():
    e1, e2 = executor("host1", 1), executor("host2", 2)
    infos = {
        0: ReceiverTrackingInfo(0, ReceiverState.INACTIVE, None, None),
        # e1 gets 1/2: the host-only candidate takes the other half but weighs on nobody.
        1: scheduled(1, e1, HostTaskLocation("host9")),
        2: active(2, e2),
    }
    assert policy.reschedule_receiver(3, None, infos, [e1, e2]) == [e1]


def test_reschedule_never_returns_a_dead_executor():
    alive, dead = executor("host1", 1), executor("host2", 2)
    infos = {0: active(0, alive), 1: scheduled(1, dead, executor("host3", 3))}
    assert policy.reschedule_receiver(2, None, infos, [alive]) == [alive]


def test_reschedule_reads_an_executor_preferred_location():
    e1, e2 = executor("host1", 1), executor("host2", 2)
    infos = {0: active(0, e1)}
    assert policy.reschedule_receiver(1, str(e1), infos, [e1, e2]) == [e1, e2]


# --- schedule_receivers ---------------------------------------------------------------


def test_schedule_evenly_with_more_receivers_than_executors():
    receivers = [FakeReceiver(i) for i in range(6)]
    executors = [executor("localhost", i) for i in range(3)]
    placement = policy.schedule_receivers(receivers, executors)
    assert set(placement) == set(range(6))
    assert all(len(locations) == 1 for locations in placement.values())
    assert load_per_location(placement) == dict.fromkeys(executors, 2)


def test_schedule_evenly_with_more_executors_than_receivers():
    receivers = [FakeReceiver(i) for i in range(3)]
    executors = [executor("localhost", i) for i in range(6)]
    placement = policy.schedule_receivers(receivers, executors)
    assert all(len(locations) == 2 for locations in placement.values())
    assert all(
        isinstance(loc, ExecutorCacheTaskLocation)
        for locations in placement.values()
        for loc in locations
    )
    assert load_per_location(placement) == dict.fromkeys(executors, 1)


def test_schedule_evenly_with_even_preferred_locations():
    receivers = [FakeReceiver(i) for i in range(3)] + [
        FakeReceiver(i, "localhost") for i in range(3, 6)
    ]
    on_localhost = [executor("localhost", i) for i in range(3)]
    on_localhost2 = [executor("localhost2", i) for i in range(3, 6)]
    placement = policy.schedule_receivers(receivers, on_localhost + on_localhost2)
    assert all(len(locations) == 1 for locations in placement.values())
    assert load_per_location(placement) == dict.fromkeys(on_localhost + on_localhost2, 1)
    preferred = {placement[i][0] for i in range(3, 6)}
    assert preferred == set(on_localhost)


def test_schedule_keeps_an_unknown_preferred_host_as_a_host_location():
    receivers = [FakeReceiver(0, "elsewhere"), FakeReceiver(1)]
    executors = [executor("localhost", 0), executor("localhost", 1)]
    placement = policy.schedule_receivers(receivers, executors)
    # Receiver 0 keeps its host; receiver 1 takes executor 0. Both then have one
    # candidate, and the idle executor 1 goes to the first of them.
    assert placement == {
        0: [HostTaskLocation("elsewhere"), executors[1]],
        1: [executors[0]],
    }


def test_schedule_with_no_receivers_returns_nothing():
    assert policy.schedule_receivers([], [executor("localhost", 1)]) == {}


def test_schedule_with_no_executors_gives_every_receiver_no_location():
    receivers = [FakeReceiver(i) for i in range(3)]
    assert policy.schedule_receivers(receivers, []) == {0: [], 1: [], 2: []}


def test_schedule_rejects_duplicate_stream_ids():
    with pytest.raises(ValueError, match="stream id 1"):
        policy.schedule_receivers([FakeReceiver(1), FakeReceiver(1)], [executor("h", 1)])


# --- properties -----------------------------------------------------------------------

_HOSTS = ["h0", "h1", "h2", "h3"]


@st.composite
def _executors(draw: st.DrawFn, min_size: int = 0) -> list[ExecutorCacheTaskLocation]:
    ids = draw(st.lists(st.integers(0, 50), min_size=min_size, max_size=12, unique=True))
    return [executor(draw(st.sampled_from(_HOSTS)), i) for i in ids]


@given(
    executors=_executors(min_size=1),
    preferred=st.lists(st.none() | st.sampled_from([*_HOSTS, "unknown"]), max_size=20),
)
def test_every_receiver_gets_a_location_when_executors_exist(executors, preferred):
    receivers = [FakeReceiver(i, p) for i, p in enumerate(preferred)]
    placement = policy.schedule_receivers(receivers, executors)
    assert set(placement) == {r.stream_id for r in receivers}
    assert all(placement.values())
    for receiver in receivers:
        if receiver.preferred_location is not None:
            assert placement[receiver.stream_id][0].host == receiver.preferred_location
    if receivers:
        # Every executor is a candidate of some receiver.
        assert set(executors) <= set(load_per_location(placement))


@given(executors=_executors(min_size=1), num_receivers=st.integers(0, 30))
def test_load_is_even_without_preferred_locations(executors, num_receivers):
    receivers = [FakeReceiver(i) for i in range(num_receivers)]
    placement = policy.schedule_receivers(receivers, executors)
    if not receivers:
        assert placement == {}
        return
    load = load_per_location(placement)
    assert set(load) == set(executors)
    assert max(load.values()) - min(load.values()) <= 1
    sizes = [len(locations) for locations in placement.values()]
    assert max(sizes) - min(sizes) <= 1


@given(
    executors=_executors(),
    states=st.lists(st.sampled_from(list(ReceiverState)), max_size=10),
    data=st.data(),
)
def test_reschedule_returns_live_executors_of_minimum_weight(executors, states, data):
    pool = [*executors, executor("dead", 99)]
    infos: dict[int, ReceiverTrackingInfo] = {}
    for i, state in enumerate(states):
        if state is ReceiverState.ACTIVE:
            infos[i] = active(i, data.draw(st.sampled_from(pool)))
        elif state is ReceiverState.SCHEDULED:
            locations = data.draw(st.lists(st.sampled_from(pool), min_size=1, unique=True))
            infos[i] = scheduled(i, *locations)
        else:
            infos[i] = ReceiverTrackingInfo(i, state, None, None)
    chosen = policy.reschedule_receiver(len(states), None, infos, executors)
    if not executors:
        assert chosen == []
        return
    assert chosen
    assert set(chosen) <= set(executors)
    assert len(chosen) == len(set(chosen))
    # A reference computation of the weights.
    weight = dict.fromkeys(pool, 0.0)
    for info in infos.values():
        if info.running_executor is not None:
            weight[info.running_executor] += 1.0
        for location in info.scheduled_locations or ():
            weight[location] += 1.0 / len(info.scheduled_locations or ())
    lightest = min(weight[e] for e in executors)
    assert {weight[e] for e in chosen} == {lightest}
    assert set(chosen) == {e for e in executors if weight[e] == lightest}
