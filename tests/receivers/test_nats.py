"""NatsReceiver against a real nats-server with JetStream (scripts/services.sh: a login)."""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import nats
import nats.js.api as api
import nats.js.client
import pyarrow as pa
import pytest
from harness import HarnessSupervisor, free_port
from service_fixtures import restart_service
from waiting import wait_until

from spark_receivers.errors import ConfigError
from spark_receivers.receivers import NatsReceiver
from spark_receivers.receivers.nats_jetstream import redact

HERE = Path(__file__).resolve().parent


def run(coro):
    return asyncio.run(coro)


async def _connect(url: str):
    from spark_receivers.receivers.nats_jetstream import _split_url

    server, user, password, _ = _split_url(url)
    return await nats.connect(servers=[server], user=user, password=password)


@pytest.fixture
def stream(nats_url):
    """A file-stored stream of its own on subjects ``<stream>.>``."""
    name = f"s-{uuid.uuid4().hex[:8]}"

    async def create():
        nc = await _connect(nats_url)
        try:
            await nc.jetstream().add_stream(
                name=name, subjects=[f"{name}.>"], storage=api.StorageType.FILE
            )
        finally:
            await nc.close()

    run(create())
    return name


def publish(url: str, subject: str, payloads: list[bytes]) -> None:
    """Each message acknowledged by JetStream (stored in the stream) before the next."""

    async def go():
        nc = await _connect(url)
        try:
            js = nc.jetstream()
            for p in payloads:
                await js.publish(subject, p)
        finally:
            await nc.close()

    run(go())


def consumer_state(url: str, stream: str, durable: str) -> tuple[int, int]:
    """``(num_pending, num_ack_pending)`` of the durable consumer."""

    async def go():
        nc = await _connect(url)
        try:
            info = await nc.jetstream().consumer_info(stream, durable)
            return info.num_pending, info.num_ack_pending
        finally:
            await nc.close()

    return run(go())


def start(receiver) -> HarnessSupervisor:
    return HarnessSupervisor(receiver).start()


def test_messages_arrive_in_order_and_are_acked_after_the_store(nats_url, stream):
    publish(nats_url, f"{stream}.a", [f"before {i}".encode() for i in range(50)])
    receiver = NatsReceiver(nats_url, stream, durable="d1", max_batch=100, fetch_wait_ms=100)
    sup = HarnessSupervisor(receiver)
    acked_at_store: list[int] = []
    sup.on_reliable_store = lambda records: acked_at_store.append(receiver.messages_acked)
    sup.start()
    try:
        publish(nats_url, f"{stream}.b", [f"after {i}".encode() for i in range(500)])
        records = sup.wait_for(550)
        assert records == [f"before {i}" for i in range(50)] + [f"after {i}" for i in range(500)]
        assert all(len(batch) <= 100 for batch in sup.reliable_batches)
        assert wait_until(lambda: receiver.messages_acked == 550, 5)
        sizes = [len(b) for b in sup.reliable_batches]
        assert acked_at_store == [sum(sizes[:i]) for i in range(len(sizes))]
    finally:
        sup.shutdown()
    assert consumer_state(nats_url, stream, "d1") == (0, 0)


def test_an_idle_stream_is_waited_on_whichever_timeout_a_fetch_raises(
    nats_url, stream, monkeypatch
):
    # An empty pull fetch ends in nats-py's TimeoutError or, from the path where the
    # server's "no messages" answer uses up the wait, asyncio's (the builtin): both mean
    # "nothing yet". Taking the second for a failure restarted the receiver (ft37). With a
    # 1 ms wait an idle stream meets both kinds within seconds; the spy only counts them.
    seen: collections.Counter[str] = collections.Counter()
    real = nats.js.client.JetStreamContext.PullSubscription.fetch

    async def counted_fetch(self, *args, **kwargs):
        try:
            return await real(self, *args, **kwargs)
        except TimeoutError as e:
            seen["asyncio" if type(e) is TimeoutError else "nats"] += 1
            raise

    monkeypatch.setattr(nats.js.client.JetStreamContext.PullSubscription, "fetch", counted_fetch)
    receiver = NatsReceiver(nats_url, stream, durable="idle", fetch_wait_ms=1)
    sup = start(receiver)
    try:
        assert wait_until(lambda: seen["asyncio"] >= 3 and seen["nats"] >= 3, 30), seen
        publish(nats_url, f"{stream}.a", [f"m{i}".encode() for i in range(20)])
        assert sup.wait_for(20) == [f"m{i}" for i in range(20)]
    finally:
        sup.shutdown()
    assert sup.restarts == [] and sup.errors == [], (sup.restarts, sup.errors, seen)


def test_a_message_whose_store_failed_comes_again_after_ack_wait_flagged(nats_url, stream):
    publish(nats_url, f"{stream}.a", [b"a", b"b"])
    schema = pa.schema([("payload", pa.string()), ("num_delivered", pa.int64())])
    receiver = NatsReceiver(
        nats_url, stream, durable="d1", schema=schema, fetch_wait_ms=100, ack_wait_s=1.0
    )
    sup = HarnessSupervisor(receiver)
    sup.fail_stores = OSError("driver unreachable")
    sup.start()
    try:
        assert wait_until(lambda: sup.restarts, 10)
        sup.fail_stores = None
        records = sup.wait_for(2)
        assert [r["payload"] for r in records] == ["a", "b"]
        assert all(r["num_delivered"] >= 2 for r in records)  # the server's count
        assert wait_until(lambda: consumer_state(nats_url, stream, "d1") == (0, 0), 5)
    finally:
        sup.shutdown()


WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path.insert(0, {here!r})
    from harness import HarnessSupervisor
    from spark_receivers.receivers import NatsReceiver

    url, stream, out = sys.argv[1:4]
    receiver = NatsReceiver(url, stream, durable="d1", fetch_wait_ms=100, ack_wait_s=1.0)
    sup = HarnessSupervisor(receiver)

    def stored_then_killed(records):
        # the store is done (written and synced), the acks not yet sent: kill -9 now
        with open(out, "w") as f:
            json.dump(records, f)
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    sup.on_reliable_store = stored_then_killed
    sup.start()
    signal.pause()
    """
)


def test_a_message_stored_but_not_acked_before_a_kill_9_is_delivered_again(
    nats_url, stream, tmp_path
):
    publish(nats_url, f"{stream}.a", [f"m{i}".encode() for i in range(5)])
    out = tmp_path / "stored.json"
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(here=str(HERE)))
    done = subprocess.run(
        [sys.executable, str(script), nats_url, stream, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    stored = json.loads(out.read_text())
    assert stored == [f"m{i}" for i in range(5)]
    receiver = NatsReceiver(nats_url, stream, durable="d1", fetch_wait_ms=100, ack_wait_s=1.0)
    sup = start(receiver)
    try:
        assert sup.wait_for(5) == stored  # after AckWait, the same durable gets them again
        assert wait_until(lambda: receiver.messages_acked == 5, 5)
        assert receiver.redelivered == 5
    finally:
        sup.shutdown()
    assert consumer_state(nats_url, stream, "d1") == (0, 0)


def test_a_server_restart_mid_stream_loses_nothing_acked(nats_url, stream):
    # An ack sent while the server goes down can be lost (the CI run of stop 38: "flush
    # timeout"); its messages stay ack-pending until AckWait, then come again and are acked.
    # A short AckWait keeps that path inside the wait below instead of 30 s beyond it.
    receiver = NatsReceiver(
        nats_url,
        stream,
        durable="d1",
        fetch_wait_ms=100,
        ack_wait_s=2.0,
        backoff_base_ms=200,
        max_backoff_ms=1000,
    )
    sup = start(receiver)
    try:
        publish(nats_url, f"{stream}.a", [f"first {i}".encode() for i in range(300)])
        sup.wait_for(300)
        publish(nats_url, f"{stream}.a", [f"stored {i}".encode() for i in range(300)])
        restart_service("nats")  # SIGTERM, then a start on the same JetStream store
        publish(nats_url, f"{stream}.a", [f"second {i}".encode() for i in range(300)])
        expected = {f"{p} {i}" for p in ("first", "stored", "second") for i in range(300)}
        assert wait_until(lambda: expected <= set(sup.records), 60), (
            f"{len(expected - set(sup.records))} of {len(expected)} acknowledged messages missing"
        )
        assert sup.restarts  # the connection was lost and the receiver came back
        assert wait_until(lambda: consumer_state(nats_url, stream, "d1") == (0, 0), 60)
    finally:
        sup.shutdown()


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_bad_messages_go_by_the_policy_and_are_terminated(nats_url, stream, tmp_path, policy):
    big = b"z" * 4096
    later = [f"later {i}".encode() for i in range(50)]
    publish(nats_url, f"{stream}.a", [b"before", b"x\xff", big, *later])
    receiver = NatsReceiver(
        nats_url,
        stream,
        durable="d1",
        fetch_wait_ms=100,
        max_record_bytes=1024,
        bad_record_policy=policy,
        dead_letter_dir=str(tmp_path) if policy == "dead_letter" else None,
    )
    sup = start(receiver)
    try:
        assert sup.wait_for(51) == ["before"] + [f"later {i}" for i in range(50)]
        errors = sup.wait_for_errors(2)
        assert "is not UTF-8" in errors[0]
        assert "is 4,096 bytes, longer than max_record_bytes" in errors[1]
        assert sup.restarts == [] and receiver.bad_records == 2
        assert receiver.messages_terminated == 2
        assert wait_until(lambda: consumer_state(nats_url, stream, "d1") == (0, 0), 5)
    finally:
        sup.shutdown()
    if policy == "dead_letter":
        (path,) = tmp_path.glob("stream-0-*.jsonl")
        letters = [json.loads(line) for line in path.read_text().splitlines()]
        assert base64.b64decode(letters[0]["base64"]) == b"x\xff"
        assert letters[0]["key"] == "stream seq 2"


def test_a_bad_message_under_fail_stops_and_is_delivered_again(nats_url, stream):
    publish(nats_url, f"{stream}.a", [b"before", b"x\xff", b"after"])
    receiver = NatsReceiver(
        nats_url, stream, durable="d1", fetch_wait_ms=100, ack_wait_s=1.0, bad_record_policy="fail"
    )
    sup = start(receiver)
    assert wait_until(lambda: sup.stopped_with is not None, 10)
    assert "not UTF-8" in sup.stopped_with
    assert sup.records == ["before"] and receiver.messages_acked == 1
    again = NatsReceiver(nats_url, stream, durable="d1", fetch_wait_ms=100, ack_wait_s=1.0)
    sup2 = start(again)
    try:
        assert sup2.wait_for(1) == ["after"]  # the bad one came again: skipped this time
        assert again.bad_records == 1
    finally:
        sup2.shutdown()


def test_an_unreachable_server_a_bad_login_and_a_missing_stream_say_so_without_the_password(
    nats_url, stream
):
    secret = nats_url.split(":")[2].split("@")[0]
    port = free_port()  # nothing listens there
    cases = [
        (f"nats://spark:{secret}@127.0.0.1:{port}", stream,
         f"cannot connect to the NATS server at nats://spark:***@127.0.0.1:{port}"),
        (nats_url.replace(secret, secret + "-wrong"), stream,
         "refused the login of user 'spark': check the credentials"),
        (nats_url, "no-such-stream", "NATS JetStream stream 'no-such-stream' does not exist"),
    ]  # fmt: skip
    for url, name, expected in cases:
        receiver = NatsReceiver(url, name, max_backoff_ms=60_000, backoff_base_ms=60_000)
        sup = start(receiver)
        try:
            assert wait_until(lambda s=sup: s.restarts, 20), url
            assert expected in sup.restarts[0], sup.restarts[0]
            assert secret not in sup.restarts[0]
        finally:
            sup.shutdown()
    assert secret not in NatsReceiver(nats_url, stream).describe()
    assert redact("nats://t0ken@h:4222") == "nats://***@h:4222"


def test_the_default_durable_is_per_job_and_stream_and_prepared_at_start(nats_url, stream):
    from spark_receivers.receiver.source_support import JobName

    publish(nats_url, f"{stream}.a", [b"before the start"])
    receiver = NatsReceiver(nats_url, stream, deliver="new", fetch_wait_ms=100)
    sup = HarnessSupervisor(receiver, stream_id=3, job_id="job.a")
    receiver.prepare_source(JobName(job_id="job.a", app_id="app-1"))  # on the driver
    publish(nats_url, f"{stream}.a", [b"after the start"])  # before the receiver connects
    sup.start()
    try:
        assert sup.wait_for(1) == ["after the start"]
        assert receiver.consumer_name == "spark-receivers-job_a-3"
    finally:
        sup.shutdown()


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="max_batch must be an integer > 0"):
        NatsReceiver("nats://h", "s", max_batch=0)
    with pytest.raises(ConfigError, match="deliver must be 'all' or 'new'"):
        NatsReceiver("nats://h", "s", deliver="last")
    with pytest.raises(ConfigError, match="stream must be letters"):
        NatsReceiver("nats://h", "a.b")
    with pytest.raises(ConfigError, match=r"nats://\[user:password@\]host"):
        NatsReceiver("http://h", "s")
