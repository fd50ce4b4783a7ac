"""AmqpReceiver against a real RabbitMQ (scripts/services.sh: 127.0.0.1, a login, no guest)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pika
import pyarrow as pa
import pytest
from harness import HarnessSupervisor, free_port
from service_fixtures import restart_service
from waiting import wait_until

from spark_receivers.errors import ConfigError
from spark_receivers.receivers import AmqpReceiver
from spark_receivers.receivers.amqp import prefetch_for, redact

HERE = Path(__file__).resolve().parent


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


@pytest.fixture
def queue(amqp_url):
    """A durable queue of its own whose rejected messages go to ``<queue>.dead``."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    with connect(amqp_url) as conn:
        ch = conn.channel()
        ch.exchange_declare(f"{name}.dlx", "fanout", durable=True)
        ch.queue_declare(f"{name}.dead", durable=True)
        ch.queue_bind(f"{name}.dead", f"{name}.dlx")
        ch.queue_declare(name, durable=True, arguments={"x-dead-letter-exchange": f"{name}.dlx"})
    return name


def publish(url: str, queue: str, bodies: list[bytes]) -> None:
    """Persistent messages, each confirmed by the broker (publisher confirms)."""
    with connect(url) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i, body in enumerate(bodies):
            ch.basic_publish(
                "",
                queue,
                body,
                pika.BasicProperties(delivery_mode=2, message_id=f"m{i}"),
                mandatory=True,
            )


def depth(url: str, queue: str) -> int:
    """Messages ready in ``queue`` (not those delivered and unacked)."""
    with connect(url) as conn:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)


def take_all(url: str, queue: str) -> list[bytes]:
    out = []
    with connect(url) as conn:
        ch = conn.channel()
        while True:
            method, _, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append(body)


def start(receiver) -> HarnessSupervisor:
    return HarnessSupervisor(receiver).start()


def test_messages_arrive_in_order_and_are_acked_after_the_store(amqp_url, queue):
    publish(amqp_url, queue, [f"before {i}".encode() for i in range(50)])
    receiver = AmqpReceiver(amqp_url, queue, max_batch=100, batch_wait_ms=50)
    sup = HarnessSupervisor(receiver)
    unacked_at_store: list[int] = []
    sup.on_reliable_store = lambda records: unacked_at_store.append(receiver.messages_acked)
    sup.start()
    try:
        publish(amqp_url, queue, [f"after {i}".encode() for i in range(1000)])
        records = sup.wait_for(1050)
        assert records == [f"before {i}" for i in range(50)] + [f"after {i}" for i in range(1000)]
        assert all(len(batch) <= 100 for batch in sup.reliable_batches)
        assert wait_until(lambda: receiver.messages_acked == 1050, 5)
        # each batch was stored while the acks counted only the batches before it
        assert unacked_at_store == [
            sum(map(len, sup.reliable_batches[:i])) for i in range(len(sup.reliable_batches))
        ]
    finally:
        sup.shutdown()
    assert depth(amqp_url, queue) == 0
    assert receiver.redelivered == 0


def test_a_message_whose_store_failed_is_not_acked_and_comes_again_flagged(amqp_url, queue):
    publish(amqp_url, queue, [b"a", b"b"])
    schema = pa.schema([("payload", pa.string()), ("redelivered", pa.bool_())])
    receiver = AmqpReceiver(amqp_url, queue, schema=schema, batch_wait_ms=50)
    sup = HarnessSupervisor(receiver)
    sup.fail_stores = OSError("driver unreachable")
    sup.start()
    try:
        assert wait_until(lambda: sup.restarts, 10)
        sup.fail_stores = None
        assert sup.wait_for(2) == [
            {"payload": "a", "redelivered": True},
            {"payload": "b", "redelivered": True},
        ]
        assert wait_until(lambda: receiver.messages_acked == 2, 5)
    finally:
        sup.shutdown()
    assert depth(amqp_url, queue) == 0


WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path.insert(0, {here!r})
    from harness import HarnessSupervisor
    from spark_receivers.receivers import AmqpReceiver

    url, queue, out = sys.argv[1:4]
    receiver = AmqpReceiver(url, queue, max_batch=10, batch_wait_ms=50)
    sup = HarnessSupervisor(receiver)

    def stored_then_killed(records):
        # the store is done (written and synced), the ack not yet sent: kill -9 now
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
    amqp_url, queue, tmp_path
):
    publish(amqp_url, queue, [f"m{i}".encode() for i in range(5)])
    out = tmp_path / "stored.json"
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(here=str(HERE)))
    done = subprocess.run(
        [sys.executable, str(script), amqp_url, queue, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    stored = json.loads(out.read_text())
    assert stored == [f"m{i}" for i in range(5)]
    # the broker requeued what the dead consumer never acked: a new receiver gets it all
    receiver = AmqpReceiver(amqp_url, queue, batch_wait_ms=50)
    sup = start(receiver)
    try:
        assert sup.wait_for(5) == stored
        assert wait_until(lambda: receiver.messages_acked == 5, 5)
        assert receiver.redelivered == 5
    finally:
        sup.shutdown()
    assert depth(amqp_url, queue) == 0


# A bound, not a verdict: the restart alone may take minutes beside a CPU hog (its own
# bound is in scripts/services.sh and restart_service).
@pytest.mark.timeout(600)
def test_a_broker_restart_mid_stream_loses_nothing_acked(amqp_url, queue):
    receiver = AmqpReceiver(
        amqp_url, queue, batch_wait_ms=50, backoff_base_ms=200, max_backoff_ms=1000
    )
    sup = start(receiver)
    try:
        publish(amqp_url, queue, [f"first {i}".encode() for i in range(300)])
        sup.wait_for(300)
        publish(amqp_url, queue, [f"queued {i}".encode() for i in range(300)])
        restart_service("amqp")  # SIGTERM, then a start on the same data: the durable queue
        publish(amqp_url, queue, [f"second {i}".encode() for i in range(300)])
        expected = {f"{p} {i}" for p in ("first", "queued", "second") for i in range(300)}
        assert wait_until(lambda: expected <= set(sup.records), 60), (
            f"{len(expected - set(sup.records))} of {len(expected)} confirmed messages missing"
        )
        assert sup.restarts  # the connection was lost and the receiver came back
        assert wait_until(lambda: depth(amqp_url, queue) == 0, 10)
    finally:
        sup.shutdown()


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_bad_messages_go_by_the_policy_and_to_the_dead_letter_exchange(
    amqp_url, queue, tmp_path, policy
):
    big = b"z" * 4096
    publish(
        amqp_url, queue, [b"before", b"x\xff", big, *[f"later {i}".encode() for i in range(50)]]
    )
    receiver = AmqpReceiver(
        amqp_url,
        queue,
        batch_wait_ms=50,
        max_record_bytes=1024,
        bad_record_policy=policy,
        dead_letter_dir=str(tmp_path) if policy == "dead_letter" else None,
    )
    sup = start(receiver)
    try:
        assert sup.wait_for(51) == ["before"] + [f"later {i}" for i in range(50)]
        assert wait_until(lambda: receiver.messages_acked == 51, 5)
        errors = sup.wait_for_errors(2)
        assert "is not UTF-8" in errors[0]
        assert "is 4,096 bytes, longer than max_record_bytes" in errors[1]
        assert sup.restarts == [] and receiver.bad_records == 2
        assert receiver.messages_rejected == 2
    finally:
        sup.shutdown()
    assert depth(amqp_url, queue) == 0
    # rejected without requeueing: the queue's dead-letter exchange routed them
    assert take_all(amqp_url, f"{queue}.dead") == [b"x\xff", big]
    if policy == "dead_letter":
        (path,) = tmp_path.glob("stream-0-*.jsonl")
        letters = [json.loads(line) for line in path.read_text().splitlines()]
        assert base64.b64decode(letters[0]["base64"]) == b"x\xff"


def test_a_bad_message_under_fail_stops_and_stays_in_the_queue(amqp_url, queue):
    publish(amqp_url, queue, [b"before", b"x\xff", b"after"])
    receiver = AmqpReceiver(amqp_url, queue, batch_wait_ms=50, bad_record_policy="fail")
    sup = start(receiver)
    assert wait_until(lambda: sup.stopped_with is not None, 10)
    assert "not UTF-8" in sup.stopped_with
    assert sup.records == ["before"] and receiver.messages_acked == 1
    assert wait_until(lambda: depth(amqp_url, queue) == 2, 10)  # requeued, not lost
    assert take_all(amqp_url, queue) == [b"x\xff", b"after"]


def test_an_unreachable_broker_a_bad_login_and_a_missing_queue_say_so_without_the_password(
    amqp_url, queue
):
    secret = amqp_url.split(":")[2].split("@")[0]
    port = free_port()  # nothing listens there
    cases = [
        (
            f"amqp://spark:{secret}@127.0.0.1:{port}/%2F",
            queue,
            f"cannot connect to the AMQP broker at amqp://spark:***@127.0.0.1:{port}/%2F",
        ),
        (
            amqp_url.replace(secret, secret + "-wrong"),
            queue,
            "refused the login of user 'spark': check the user and password",
        ),
        (
            amqp_url,
            "no-such-queue",
            "AMQP queue 'no-such-queue' does not exist at amqp://spark:***@",
        ),
    ]
    for url, name, expected in cases:
        receiver = AmqpReceiver(url, name, max_backoff_ms=60_000, backoff_base_ms=60_000)
        sup = start(receiver)
        try:
            assert wait_until(lambda s=sup: s.restarts, 20), url
            assert expected in sup.restarts[0], sup.restarts[0]
            assert secret not in sup.restarts[0]
        finally:
            sup.shutdown()
    assert secret not in AmqpReceiver(amqp_url, queue).describe()
    assert redact("amqp://u:p@ss@h:1/v?x=1") == "amqp://u:***@h:1/v?x=1"


def test_the_prefetch_is_bound_to_the_block_budget(amqp_url, queue):
    assert prefetch_for(512 * 2**20, 2**20, 1000) == 512  # 512 unacked of 1 MiB fill 512 MiB
    assert prefetch_for(64 * 2**20, 2**20, 1000) == 64
    assert prefetch_for(2**20, 4 * 2**20, 1000) == 1
    assert prefetch_for(2**40, 16, 10**6) == 65535
    receiver = AmqpReceiver(amqp_url, queue, max_record_bytes=2**20, batch_wait_ms=2000)
    sup = HarnessSupervisor(receiver)
    sup.config = sup.config.replace(block_store_memory_bytes=8 * 2**20)
    sup.store_delay_s = 1.0
    publish(amqp_url, queue, [f"m{i}".encode() for i in range(40)])
    sup.start()
    try:
        records = sup.wait_for(40)
        assert records == [f"m{i}" for i in range(40)]
        # at most 8 unacked at a time: no store is larger than the window
        assert receiver.prefetch_count == 8
        assert max(len(b) for b in sup.reliable_batches) == 8
    finally:
        sup.shutdown()


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="max_batch must be an integer > 0"):
        AmqpReceiver("amqp://u:p@h/v", "q", max_batch=0)
    with pytest.raises(ConfigError, match="prefetch must be in 1-65535"):
        AmqpReceiver("amqp://u:p@h/v", "q", prefetch=70000)
    with pytest.raises(ConfigError, match=r"amqp\[s\]://user:password@host"):
        AmqpReceiver("http://u:p@h/v", "q")
    with pytest.raises(ConfigError, match="fields among"):
        AmqpReceiver("amqp://h/v", "q", schema=pa.schema([("nope", pa.string())]))
