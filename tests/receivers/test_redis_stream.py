"""RedisStreamReceiver against a real redis-server (scripts/services.sh, 127.0.0.1)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from harness import HarnessSupervisor, wait_until

from spark_receivers.errors import ConfigError
from spark_receivers.receivers import RedisStreamReceiver


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def names():
    tag = uuid.uuid4().hex[:8]
    return f"stream-{tag}", f"group-{tag}"


def pending(client, stream, group) -> int:
    return int(client.xpending(stream, group)["pending"])


def add(client, stream, values) -> list[str]:
    pipe = client.pipeline()
    for v in values:
        pipe.xadd(stream, {"value": v})
    return pipe.execute()


def run(receiver) -> HarnessSupervisor:
    return HarnessSupervisor(receiver).start()


def test_every_entry_arrives_in_order_and_is_acked(redis_url, client, names):
    stream, group = names
    add(client, stream, [f"before {i}" for i in range(50)])  # the group reads the whole stream
    receiver = RedisStreamReceiver(stream, group, url=redis_url, batch=100, block_ms=100)
    sup = run(receiver)
    try:
        add(client, stream, [f"after {i}" for i in range(1000)])
        records = sup.wait_for(1050)
        assert records == [f"before {i}" for i in range(50)] + [f"after {i}" for i in range(1000)]
        assert all(len(batch) <= 100 for batch in sup.reliable_batches)
        assert wait_until(lambda: pending(client, stream, group) == 0, 5)
    finally:
        sup.shutdown()
    assert pending(client, stream, group) == 0


def test_pending_entries_of_a_dead_consumer_and_its_own_are_taken_back(redis_url, client, names):
    stream, group = names
    client.xgroup_create(stream, group, id="0", mkstream=True)
    add(client, stream, [f"e{i}" for i in range(30)])
    # a consumer that died after reading 10 entries (never acked) ...
    client.xreadgroup(group, "dead-consumer", {stream: ">"}, count=10)
    # ... and this receiver's own earlier life, which read 10 more and died before acking
    client.xreadgroup(group, "spark-receivers-0", {stream: ">"}, count=10)
    assert pending(client, stream, group) == 20
    receiver = RedisStreamReceiver(stream, group, url=redis_url, claim_min_idle_ms=0, block_ms=100)
    sup = run(receiver)
    try:
        records = sup.wait_for(30)
        assert sorted(records) == sorted(f"e{i}" for i in range(30))
        assert len(records) == 30
        assert wait_until(lambda: pending(client, stream, group) == 0, 5)
    finally:
        sup.shutdown()


def test_an_entry_whose_store_failed_is_not_acked_and_comes_again(redis_url, client, names):
    stream, group = names
    add(client, stream, ["a", "b"])
    receiver = RedisStreamReceiver(stream, group, url=redis_url, block_ms=100)
    sup = HarnessSupervisor(receiver)
    sup.fail_stores = OSError("driver unreachable")
    sup.start()
    try:
        assert wait_until(lambda: sup.restarts, 5)
        assert pending(client, stream, group) == 2  # read, not stored, so not acked
        sup.fail_stores = None
        assert sup.wait_for(2) == ["a", "b"]  # re-read from its own pending list
        assert wait_until(lambda: pending(client, stream, group) == 0, 5)
    finally:
        sup.shutdown()


def test_whole_entries_as_json_and_entries_without_the_field(redis_url, client, names):
    stream, group = names
    ids = [client.xadd(stream, {"k": "v", "n": "1"})]
    receiver = RedisStreamReceiver(stream, group, url=redis_url, field=None, block_ms=100)
    sup = run(receiver)
    try:
        assert [json.loads(r) for r in sup.wait_for(1)] == [
            {"id": ids[0], "fields": {"k": "v", "n": "1"}}
        ]
    finally:
        sup.shutdown()
    stream2 = stream + "-2"
    client.xadd(stream2, {"other": "x"})
    client.xadd(stream2, {"value": "y"})
    sup = run(RedisStreamReceiver(stream2, group, url=redis_url, block_ms=100))
    try:
        assert sup.wait_for(1) == ["y"]
        assert "no field 'value'" in sup.wait_for_errors(1)[0]
        assert wait_until(lambda: pending(client, stream2, group) == 0, 5)
    finally:
        sup.shutdown()


def test_unreachable_server_restarts_with_backoff():
    receiver = RedisStreamReceiver("s", "g", url="redis://127.0.0.1:1/0", block_ms=100)
    sup = run(receiver)
    try:
        assert wait_until(lambda: sup.restarts, 10)
        assert "127.0.0.1:1" in sup.restarts[0]
    finally:
        sup.shutdown()


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="batch"):
        RedisStreamReceiver("s", "g", batch=0)
    with pytest.raises(ConfigError, match="stream and group"):
        RedisStreamReceiver("", "g")
