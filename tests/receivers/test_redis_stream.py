"""RedisStreamReceiver against a real redis-server (scripts/services.sh, 127.0.0.1)."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from datetime import UTC, datetime

import pyarrow as pa
import pytest
import redis
from harness import HarnessSupervisor
from service_fixtures import restart_service
from waiting import wait_until

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
        # good entries: each batch one Arrow array, no str per entry
        assert sup.tables_stored == len(sup.reliable_batches)
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


# --- poison entries: the bad-record policy, never a stalled group ------------------------


@pytest.fixture
def binary_client(redis_url):
    c = redis.Redis.from_url(redis_url)  # bytes in, bytes out
    yield c
    c.close()


def poisoned(client, binary_client, stream) -> str:
    """ "before", then what ``printf 'x\\xff' | redis-cli -x XADD s '*' value`` adds."""
    add(client, stream, ["before"])
    return binary_client.xadd(stream, {"value": b"x\xff"}).decode()


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_a_binary_entry_is_skipped_or_dead_lettered_and_later_entries_arrive(
    redis_url, client, binary_client, names, tmp_path, policy
):
    stream, group = names
    bad_id = poisoned(client, binary_client, stream)
    add(client, stream, [f"later {i}" for i in range(100)])
    receiver = RedisStreamReceiver(
        stream,
        group,
        url=redis_url,
        block_ms=100,
        bad_record_policy=policy,
        dead_letter_dir=str(tmp_path) if policy == "dead_letter" else None,
    )
    sup = run(receiver)
    try:
        assert sup.wait_for(101) == ["before"] + [f"later {i}" for i in range(100)]
        assert wait_until(lambda: pending(client, stream, group) == 0, 5)
        (error,) = sup.wait_for_errors(1)
        assert f"entry {bad_id}" in error and "not UTF-8" in error
        assert sup.restarts == [] and sup.stopped_with is None
        assert receiver.bad_records == 1
    finally:
        sup.shutdown()
    assert pending(client, stream, group) == 0
    if policy == "dead_letter":
        (path,) = tmp_path.glob("stream-0-*.jsonl")
        (letter,) = [json.loads(line) for line in path.read_text().splitlines()]
        assert letter["key"] == bad_id
        assert base64.b64decode(letter["base64"]) == b"x\xff"
        assert "not UTF-8" in letter["reason"]


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_an_entry_over_max_record_bytes_goes_by_the_policy_and_the_others_arrive(
    redis_url, client, names, tmp_path, policy
):
    """A 3 MiB entry among small ones (issue 36: one of 100 MB, all XACKed, none stored)."""
    stream, group = names
    add(client, stream, [f"small {i}" for i in range(50)])
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    big = b"y" * (3 * 1024 * 1024)
    done = subprocess.run(  # the real client, the value from stdin
        ["redis-cli", "-p", port, "-x", "XADD", stream, "*", "value"],
        input=big,
        capture_output=True,
        check=True,
        timeout=30,
    )
    big_id = done.stdout.decode().strip()
    add(client, stream, [f"small {i}" for i in range(50, 100)])
    receiver = RedisStreamReceiver(
        stream,
        group,
        url=redis_url,
        block_ms=100,
        bad_record_policy=policy,
        dead_letter_dir=str(tmp_path) if policy == "dead_letter" else None,
    )
    sup = run(receiver)
    try:
        assert sup.wait_for(100) == [f"small {i}" for i in range(100)]
        assert wait_until(lambda: pending(client, stream, group) == 0, 5)
        (error,) = sup.wait_for_errors(1)
        assert f"entry {big_id} of stream '{stream}' is 3,145,733 bytes, longer than " in error
        assert receiver.bad_records == 1 and sup.restarts == []
    finally:
        sup.shutdown()
    if policy == "dead_letter":
        (path,) = tmp_path.glob("stream-0-*.jsonl")
        (letter,) = [json.loads(line) for line in path.read_text().splitlines()]
        assert letter["key"] == big_id and letter["bytes"] == len(big)
        assert (tmp_path / letter["file"]).read_bytes() == big


def test_a_binary_entry_under_fail_stops_the_receiver_and_stays_pending(
    redis_url, client, binary_client, names
):
    stream, group = names
    bad_id = poisoned(client, binary_client, stream)
    (after_id,) = add(client, stream, ["after"])
    receiver = RedisStreamReceiver(
        stream, group, url=redis_url, block_ms=100, bad_record_policy="fail"
    )
    sup = run(receiver)
    try:
        assert wait_until(lambda: sup.stopped_with is not None, 10)
        assert sup.stopped_with.startswith(f"bad record: entry {bad_id}")
        assert sup.records == ["before"]  # the entry before it was stored (and acked)
        assert sup.restarts == []  # stopped with the error: the driver decides what next
        detail = client.xpending_range(stream, group, min="-", max="+", count=10)
        assert [p["message_id"] for p in detail] == [bad_id, after_id]
    finally:
        sup.shutdown()


def test_entries_that_do_not_fit_a_declared_schema_are_bad_records(redis_url, client, names):
    stream, group = names
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    client.xadd(stream, {"user": "ann", "n": "3"})
    client.xadd(stream, {"user": "bob", "n": "many"})
    client.xadd(stream, {"user": "cy", "extra": "x"})
    client.xadd(stream, {"user": "dee", "n": "4"})
    receiver = RedisStreamReceiver(
        stream, group, url=redis_url, field=None, schema=schema, block_ms=100
    )
    sup = run(receiver)
    try:
        assert sup.wait_for(2) == [{"user": "ann", "n": 3}, {"user": "dee", "n": 4}]
        errors = sup.wait_for_errors(2)
        assert "'n' (int64) cannot hold value 'many'" in errors[0]
        assert "extra" in errors[1]
        assert wait_until(lambda: pending(client, stream, group) == 0, 5)
    finally:
        sup.shutdown()


def test_include_timestamp_is_the_time_of_the_entry_id(redis_url, client, names):
    stream, group = names
    (entry_id,) = add(client, stream, ["v"])
    receiver = RedisStreamReceiver(
        stream, group, url=redis_url, block_ms=100, include_timestamp=True
    )
    assert receiver.schema.names == ["value", "timestamp"]
    sup = run(receiver)
    try:
        (row,) = sup.wait_for(1)
        millis = int(entry_id.split("-")[0])
        assert row["value"] == "v"
        assert row["timestamp"] == datetime.fromtimestamp(millis / 1000, UTC)
    finally:
        sup.shutdown()


def test_the_default_consumer_is_per_job_and_stream(tmp_path):
    """Two jobs on one group never share a consumer name (they would re-read each other's
    pending entries); a job restarted from its checkpoint keeps its own."""
    one = RedisStreamReceiver("s", "g")
    HarnessSupervisor(one, stream_id=2, app_id="app-20240101-0007")
    assert one.consumer_name == "spark-receivers-app-20240101-0007-2"
    other = RedisStreamReceiver("s", "g")
    HarnessSupervisor(other, stream_id=2, app_id="app-20240101-0008")
    assert other.consumer_name != one.consumer_name
    before = RedisStreamReceiver("s", "g")
    HarnessSupervisor(before, stream_id=2, app_id="app-x", checkpoint_dir=str(tmp_path / "ck"))
    after = RedisStreamReceiver("s", "g")
    HarnessSupervisor(after, stream_id=2, app_id="app-y", checkpoint_dir=str(tmp_path / "ck"))
    assert before.consumer_name == after.consumer_name
    named = RedisStreamReceiver("s", "g", consumer="mine")
    HarnessSupervisor(named, app_id="app-x")
    assert named.consumer_name == "mine"


class DiesBeforeAck(RedisStreamReceiver):
    """Stores a batch, then fails its ``XACK`` once: as if killed between the two."""

    died = False

    def _ack(self, client, ids):
        if not DiesBeforeAck.died:
            DiesBeforeAck.died = True
            raise ConnectionError("killed between store and XACK")
        super()._ack(client, ids)


def test_a_batch_stored_but_not_acked_is_acked_after_the_restart_not_stored_again(
    redis_url, client, names
):
    stream, group = names
    client.xgroup_create(stream, group, id="0", mkstream=True)
    add(client, stream, [f"e{i}" for i in range(25)])
    DiesBeforeAck.died = False
    receiver = DiesBeforeAck(stream, group, url=redis_url, batch=10, block_ms=100)
    sup = run(receiver)
    try:
        add(client, stream, [f"f{i}" for i in range(25)])
        assert wait_until(lambda: pending(client, stream, group) == 0 and len(sup.records) >= 50)
        assert sup.restarts  # the failed XACK restarted it
        assert sup.records == [f"e{i}" for i in range(25)] + [f"f{i}" for i in range(25)]
        assert receiver.entries_already_stored == 10  # the first batch, acked at the restart
        first, last = sup.positions[0].rpartition(" ")[2].split("..")
        assert client.xrange(stream, first, last, count=20)[-1][1]["value"] == "e9"
    finally:
        sup.shutdown()


def test_own_pending_entries_outside_the_accepted_range_are_stored(redis_url, client, names):
    stream, group = names
    client.xgroup_create(stream, group, id="0", mkstream=True)
    ids = add(client, stream, [f"e{i}" for i in range(30)])
    receiver = RedisStreamReceiver(stream, group, url=redis_url, block_ms=100, batch=100)
    sup = HarnessSupervisor(receiver)
    # An earlier life stored e0..e9 (the driver accepted that range), and read 20 in all.
    sup.positions.append(receiver._source_tag() + f"{ids[0]}..{ids[9]}")
    client.xreadgroup(group, receiver.consumer_name, {stream: ">"}, count=20)
    sup.start()
    try:
        assert sup.wait_for(20) == [f"e{i}" for i in range(10, 30)]
        assert wait_until(lambda: pending(client, stream, group) == 0, 5)
        assert receiver.entries_already_stored == 10
    finally:
        sup.shutdown()


def test_each_batch_position_is_the_id_range_of_its_own_entries_on_every_path(
    redis_url, client, names
):
    """Own pending entries re-read, entries claimed from a dead consumer, new entries: every
    stored batch's position is ``<tag><first id>..<last id>`` of exactly its entries."""
    stream, group = names
    client.xgroup_create(stream, group, id="0", mkstream=True)
    values = [f"e{i}" for i in range(40)]
    ids = add(client, stream, values[:30])
    client.xreadgroup(group, "dead-consumer", {stream: ">"}, count=10)  # e0..e9: claimed
    receiver = RedisStreamReceiver(
        stream, group, url=redis_url, claim_min_idle_ms=0, block_ms=100, batch=4
    )
    sup = HarnessSupervisor(receiver)
    client.xreadgroup(group, receiver.consumer_name, {stream: ">"}, count=10)  # e10..e19: own
    sup.start()
    try:
        ids += add(client, stream, values[30:])
        records = sup.wait_for(40)
        assert records == values[10:20] + values[:10] + values[20:]
        id_of = dict(zip(values, ids, strict=True))
        assert len(sup.reliable_batches) >= 10  # batches of at most 4 on each path
        for batch, position in zip(sup.reliable_batches, sup.positions, strict=True):
            assert position == f"{receiver._source_tag()}{id_of[batch[0]]}..{id_of[batch[-1]]}"
        assert wait_until(lambda: pending(client, stream, group) == 0, 5)
    finally:
        sup.shutdown()


def test_a_position_of_another_stream_is_ignored_and_the_entries_are_stored(
    redis_url, client, names
):
    stream, group = names
    client.xgroup_create(stream, group, id="0", mkstream=True)
    ids = add(client, stream, [f"e{i}" for i in range(10)])
    receiver = RedisStreamReceiver(stream, group, url=redis_url, block_ms=100)
    sup = HarnessSupervisor(receiver)
    # the checkpoint's last position was read from another stream (the job was changed)
    other = receiver._source_tag().replace(stream, "another-stream")
    sup.positions.append(other + f"{ids[0]}..{ids[9]}")
    client.xreadgroup(group, receiver.consumer_name, {stream: ">"}, count=10)
    sup.start()
    try:
        assert sup.wait_for(10) == [f"e{i}" for i in range(10)]  # not acked unstored
        assert receiver.entries_already_stored == 0
    finally:
        sup.shutdown()


def test_a_server_restart_mid_stream_stores_every_entry_once(redis_url, client, names):
    """redis-server stopped (SIGTERM) and started again on its data while entries flow: the
    receiver comes back, every entry added is stored, none twice, and none stays pending."""
    stream, group = names
    client.xgroup_create(stream, group, id="0", mkstream=True)
    receiver = RedisStreamReceiver(
        stream, group, url=redis_url, batch=50, block_ms=100, max_backoff_ms=1000
    )
    sup = run(receiver)
    try:
        add(client, stream, [f"a{i}" for i in range(300)])
        assert wait_until(lambda: len(sup.records) >= 300, 30)
        add(client, stream, [f"b{i}" for i in range(300)])  # read while the server goes down
        restart_service("redis")
        after = redis.Redis.from_url(redis_url, decode_responses=True)
        try:
            add(after, stream, [f"c{i}" for i in range(300)])
            expected = [f"{p}{i}" for p in "abc" for i in range(300)]
            assert wait_until(lambda: set(expected) <= set(sup.records), 60), (
                f"{len(set(expected) - set(sup.records))} of {len(expected)} entries missing"
            )
            assert wait_until(lambda: pending(after, stream, group) == 0, 30)
            assert after.xlen(stream) == 900  # the server came back with its data
            assert sorted(sup.records) == sorted(expected), "an entry was stored twice"
            assert sup.restarts  # the connection was lost and the receiver came back
        finally:
            after.close()
    finally:
        sup.shutdown()
