"""Source URIs of ``ingest``: what each keeps, what each refuses, secrets masked (no Spark)."""

from __future__ import annotations

import os

import pytest

from spark_receivers.cli.sources import parse_source
from spark_receivers.cli.uri import mask_uri
from spark_receivers.errors import ConfigError
from spark_receivers.receivers import (
    AmqpReceiver,
    FileTailReceiver,
    GeneratorReceiver,
    HttpReceiver,
    MqttReceiver,
    NatsReceiver,
    RedisStreamReceiver,
    SocketTextReceiver,
    WebSocketReceiver,
)
from spark_receivers.receivers.mqtt_tls import MqttTlsReceiver


@pytest.mark.parametrize(
    ("uri", "kind"),
    [
        ("socket://127.0.0.1:9999", SocketTextReceiver),
        ("http://127.0.0.1:8080/ingest?token=t", HttpReceiver),
        ("file:///var/log/app", FileTailReceiver),
        ("redis://127.0.0.1:6379/events?group=g", RedisStreamReceiver),
        ("rediss://127.0.0.1:6380/events?group=g", RedisStreamReceiver),
        ("mqtt://127.0.0.1:1883/sensors", MqttReceiver),
        ("mqtts://127.0.0.1:8883/sensors", MqttTlsReceiver),
        ("generator://?rate=10", GeneratorReceiver),
        ("amqp://u:p@127.0.0.1:5672/%2F?queue=q", AmqpReceiver),
        ("amqps://u:p@127.0.0.1/prod?queue=q", AmqpReceiver),
        ("nats://u:p@127.0.0.1:4222?stream=s", NatsReceiver),
        ("ws://127.0.0.1:9000/feed", WebSocketReceiver),
        ("wss://127.0.0.1/feed", WebSocketReceiver),
    ],
)
def test_every_source_scheme(uri, kind):
    assert type(parse_source(uri).receiver) is kind


def test_redis_keeps_password_db_and_user():
    r = parse_source("redis://:pw@host:6380/2/events?group=g").receiver
    assert isinstance(r, RedisStreamReceiver)
    assert (r.url, r.stream, r.group) == ("redis://:pw@host:6380/2", "events", "g")
    r = parse_source("redis://alice:p%40ss@host/events?group=g&db=3").receiver
    assert r.url == "redis://alice:p%40ss@host:6379/3"
    # the issue's own URI: a number alone is the db, the stream then comes from ?stream=
    r = parse_source("redis://:pw@host:6380/2?stream=events&group=g").receiver
    assert (r.url, r.stream) == ("redis://:pw@host:6380/2", "events")
    assert parse_source("redis://h/?stream=7&group=g").receiver.stream == "7"


def test_redis_passes_field_consumer_batch_and_durations():
    r = parse_source(
        "redis://h/s?group=g&field=&consumer=c1&batch=50&block=2s&claim_min_idle=1min"
    ).receiver
    assert (r.field, r.consumer, r.batch, r.block_ms, r.claim_min_idle_ms) == (
        None,
        "c1",
        50,
        2000,
        60_000,
    )


def test_rediss_is_tls_with_its_files():
    r = parse_source("rediss://:pw@h/s?group=g&ca_certs=/etc/ca.pem&cert_reqs=required").receiver
    assert r.url == "rediss://:pw@h:6379/0?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required"
    with pytest.raises(ConfigError, match="unknown parameter"):
        parse_source("redis://h/s?group=g&ca_certs=/etc/ca.pem")  # TLS files need rediss


def test_mqtt_keeps_credentials_qos_client_id_and_wildcards():
    src = parse_source("mqtt://user:p%3Aw@broker/sensors/+/temp?qos=2&client_id=job-a")
    r = src.receiver
    assert isinstance(r, MqttReceiver)
    assert (r.host, r.port, r.topic, r.qos) == ("broker", 1883, "sensors/+/temp", 2)
    assert (r.username, r.password, r.client_id) == ("user", "p:w", "job-a")
    assert parse_source("mqtt://b/logs/#").receiver.topic == "logs/#"
    assert parse_source("mqtt://b/logs/#?qos=0").receiver.qos == 0
    assert parse_source("mqtt://b/logs/%23").receiver.topic == "logs/#"


def test_mqtts_is_tls_on_8883_with_its_files():
    r = parse_source("mqtts://u:pw@broker/t?ca_certs=/etc/ca.pem").receiver
    assert isinstance(r, MqttTlsReceiver)
    assert (r.port, r.username, r.password, r.ca_certs) == (8883, "u", "pw", "/etc/ca.pem")
    assert r.describe() == "MQTT broker broker:8883 (TLS)"


def test_amqp_keeps_credentials_vhost_queue_and_options():
    src = parse_source("amqp://app:p%40ss@h/prod?queue=orders&prefetch=50&batch_wait=200ms")
    r = src.receiver
    assert isinstance(r, AmqpReceiver)
    assert (r.url, r.queue, r.prefetch, r.batch_wait_ms) == (
        "amqp://app:p%40ss@h:5672/prod",
        "orders",
        50,
        200,
    )
    assert src.server == ("h", 5672) and src.acknowledgement == "a basic.ack"
    assert parse_source("amqp://u:p@h?queue=q").receiver.url == "amqp://u:p@h:5672/%2F"
    assert parse_source("amqps://u:p@h/%2F?queue=q").receiver.url == "amqps://u:p@h:5671/%2F"


def test_nats_keeps_credentials_stream_consumer_and_token():
    src = parse_source("nats://u:pw@h?stream=S&durable=d&subject=S.x&ack_wait=10s&max_deliver=5")
    r = src.receiver
    assert isinstance(r, NatsReceiver)
    assert (r.url, r.stream, r.durable, r.subject, r.ack_wait_s, r.max_deliver) == (
        "nats://u:pw@h:4222",
        "S",
        "d",
        "S.x",
        10.0,
        5,
    )
    assert src.server == ("h", 4222) and src.acknowledgement == "a JetStream ack"
    r = parse_source("nats://h:4223?stream=S&token=s3cret&deliver=new").receiver
    assert (r.url, r.token, r.deliver) == ("nats://h:4223", "s3cret", "new")


def test_ws_keeps_the_feeds_own_parameters_and_sends_the_subscription():
    src = parse_source(
        "wss://feed.example/v1?symbols=BTC&subscribe=%7B%22op%22%3A%22sub%22%7D&ping_timeout=5s"
    )
    r = src.receiver
    assert isinstance(r, WebSocketReceiver)
    assert (r.url, r.subscribe, r.ping_timeout_s) == (
        "wss://feed.example:443/v1?symbols=BTC",
        ['{"op":"sub"}'],
        5.0,
    )
    assert src.acknowledgement is None  # at most once
    assert src.server == ("feed.example", 443)
    assert parse_source("ws://h:9000").receiver.url == "ws://h:9000/"


def test_http_honours_its_port_host_path_token_and_format():
    r = parse_source("http://127.0.0.1:8091/hook?token=t0k&format=json").receiver
    assert isinstance(r, HttpReceiver)
    assert (r.host, r.port, r.path, r.format) == ("127.0.0.1", 8091, "/hook", "json")
    assert parse_source("http://127.0.0.1/ingest").receiver.port == 8080  # no port: default
    assert parse_source("http://:8092/ingest").receiver.host is None  # the executor's address


def test_http_token_from_the_environment():
    src = parse_source("http://127.0.0.1:8091/ingest", {"SPARK_RECEIVERS_HTTP_TOKEN": "envtok"})
    assert "token=***" in src.describe()
    assert "envtok" not in src.describe()


def test_file_generator_and_socket_parameters():
    r = parse_source("file:///var/log/app?pattern=*.log&start_at=end&poll_interval=1s").receiver
    assert (r.directory, r.pattern, r.start_at, r.poll_interval_ms) == (
        "/var/log/app",
        "*.log",
        "end",
        1000,
    )
    assert parse_source("file://localhost/var/log").receiver.directory == "/var/log"
    g = parse_source("generator://?rate=2.5&total=10").receiver
    assert (g.rate, g.total) == (2.5, 10)
    assert parse_source("socket://h:9/?max_record_bytes=64").receiver.max_record_bytes == 64
    assert parse_source("socket://h:9/?coalesce=20ms").receiver.coalesce_ms == 20
    assert parse_source("socket://h:9/?coalesce=0").receiver.coalesce_ms == 0
    assert parse_source("socket://h:9").receiver.coalesce_ms == 50


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("generator://?rate=abc", "parameter rate must be a finite number > 0, got 'abc'"),
        ("generator://?rate=inf", "parameter rate must be a finite number > 0, got 'inf'"),
        ("generator://?rate=nan", "parameter rate must be a finite number > 0, got 'nan'"),
        ("generator://?rate=-5", "parameter rate must be a finite number > 0"),
        ("generator://?rat=5", r"unknown parameter\(s\) rat for generator:// \(it takes: rate"),
        ("kafka://broker:9092/topic", "unknown source kafka://broker:9092/topic"),
        ("events", "unknown source events \\(no scheme\\)"),
        ("https://h/ingest", "unknown source https://h/ingest"),
        ("socket://127.0.0.1", "needs a port"),
        ("socket://:9999", "needs a host"),
        ("http://127.0.0.1:99999/ingest", "port must be an integer in 1-65535, got '99999'"),
        ("http://127.0.0.1:0/ingest", "got '0' \\(port 0"),
        ("redis://127.0.0.1:99999/s?group=g", "port must be an integer in 1-65535"),
        ("redis://127.0.0.1:6379/events", "needs a stream and a group"),
        ("redis://:pw@host:6380/2", "needs a stream and a group"),
        ("redis://h/2/s?group=g&db=3", "the db is given twice"),
        ("redis://h/s?group=g&group=h", "parameter group is given twice"),
        ("mqtt://127.0.0.1:1883", "needs a topic"),
        ("mqtt://user:pw@host", "needs a topic"),
        ("mqtt://h:abc/t", "port must be an integer in 1-65535, got 'abc'"),
        ("mqtt://h/t?qos=3", "parameter qos must be one of 0, 1, 2"),
        ("mqtts://h/t?ca_certs=ca.pem", "ca_certs must be an absolute path"),
        ("file://relative/dir", "needs an absolute directory: file:///path/to/dir"),
        ("file:relative/dir", "needs an absolute directory"),
        ("file:///d?start_at=middle", "start_at must be one of beginning, end"),
        ("http://127.0.0.1:8080/ingest?token=", "parameter token is empty"),
        ("http://127.0.0.1:8080/ingest?format=xml", "parameter format must be one of lines, json"),
        ("socket://h:1/#frag", "fragment"),
        ("socket://h:1?coalesce=2s", "parameter coalesce must be at most 1s"),
        ("amqp://u:p@h/", "needs a queue: amqp://user:password@host:port/vhost\\?queue=q"),
        ("amqp://u:p@h/?queue=q&prefetch=0", "parameter prefetch must be an integer >= 1"),
        ("amqp://u:p@h/?queue=q&bogus=1", "unknown parameter"),
        ("nats://u:p@h", "needs a stream: nats://user:password@host:port\\?stream=s"),
        ("nats://u:p@h?stream=a.b", "stream must be letters, digits"),
        ("nats://u:p@h?stream=s&deliver=last", "parameter deliver must be one of all, new"),
        ("nats://u:p@h/x?stream=s", "takes no path"),
        ("ws://h/?subscribe=", "parameter subscribe is empty"),
        ("ws://h/?ping_timeout=abc", "parameter ping_timeout must be a duration"),
    ],
)
def test_bad_sources_fail_clearly(uri, message):
    with pytest.raises(ConfigError, match=message):
        parse_source(uri)


def test_a_relative_file_uri_gets_a_hint_with_the_absolute_path():
    with pytest.raises(ConfigError) as e:
        parse_source("file://relative/dir")
    assert f"did you mean file://{os.path.abspath('relative/dir')} ?" in str(e.value)


@pytest.mark.parametrize(
    "uri",
    [
        "redis://:s3cret@h:99999/s?group=g",
        "redis://user:s3cret@h/s",
        "mqtt://user:s3cret@h",
        "http://h:99999/ingest?token=s3cret",
        "http://h:8080/ingest?format=json&token=s3cret&x=1",
        "rediss://u:s3c@ret@h/s?group=g&zzz=1",
        "amqp://u:s3cret@h/v",
        "amqp://u:s3cret@h/v?queue=q&zzz=1",
        "nats://u:s3cret@h",
        "nats://s3cret@h?stream=s",
        "nats://h?stream=s&token=s3cret&zzz=1",
        "ws://u:s3cret@h/?ping_timeout=x",
    ],
)
def test_errors_never_show_a_secret(uri):
    with pytest.raises(ConfigError) as e:
        parse_source(uri)
    assert "s3c" not in str(e.value)
    assert "***" in str(e.value)


def test_describe_masks_passwords_and_tokens():
    for uri in (
        "redis://:s3cret@h/s?group=g",
        "mqtt://u:s3cret@h/t",
        "mqtts://u:s3cret@h/t",
        "http://h:1/x?token=s3cret",
        "amqp://u:s3cret@h/v?queue=q",
        "nats://u:s3cret@h?stream=s",
        "nats://h?stream=s&token=s3cret",
        "ws://u:s3cret@h/feed",
        "wss://h/feed?token=s3cret",
    ):
        src = parse_source(uri)
        assert "s3cret" not in src.describe() + src.display, uri
        assert "***" in src.describe()


def test_mask_uri():
    assert mask_uri("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert mask_uri("mqtt://u:p@ss@h/t") == "mqtt://u:***@h/t"
    assert mask_uri("mqtt://u@h/t") == "mqtt://u@h/t"
    assert mask_uri("http://h:8080/x?a=1&TOKEN=z&b=2") == "http://h:8080/x?a=1&TOKEN=***&b=2"
    assert mask_uri("not a uri") == "not a uri"


def test_what_each_source_acknowledges():
    acks = {
        uri: parse_source(uri).acknowledgement
        for uri in (
            "http://h:1/x",
            "file:///d",
            "redis://h/s?group=g",
            "mqtt://h/t",
            "mqtt://h/t?qos=0",
            "socket://h:1",
            "generator://",
        )
    }
    assert acks == {
        "http://h:1/x": "an HTTP 200 to the client",
        "file:///d": "a saved read offset",
        "redis://h/s?group=g": "an XACK",
        "mqtt://h/t": "a PUBACK",
        "mqtt://h/t?qos=0": None,
        "socket://h:1": None,
        "generator://": None,
    }


def test_every_source_passes_the_record_options_through(tmp_path):
    from spark_receivers.cli.sources import parse_source

    dead = str(tmp_path / "dead")
    common = f"include_timestamp=true&bad_record_policy=dead_letter&dead_letter_dir={dead}"
    for uri in (
        f"socket://127.0.0.1:9999?{common}",
        f"http://127.0.0.1:8090/ingest?{common}",
        f"file://{tmp_path}?{common}",
        f"redis://127.0.0.1:6379/s?group=g&{common}",
        f"mqtt://127.0.0.1:1883/t?{common}&clean_session=true&protocol=3.1.1",
    ):
        receiver = parse_source(uri).receiver
        assert receiver.include_timestamp is True, uri
        assert receiver.bad_record_policy.value == "dead_letter", uri
        assert receiver.dead_letter_dir == dead, uri
    mqtt = parse_source(f"mqtt://127.0.0.1:1883/t?{common}&clean_session=true&protocol=3.1.1")
    assert (mqtt.receiver.clean_session, mqtt.receiver.protocol) == (True, "3.1.1")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("include_timestamp=yes", "parameter include_timestamp must be one of true, false"),
        ("bad_record_policy=drop", "parameter bad_record_policy must be one of skip"),
        ("dead_letter_dir=rel", "parameter dead_letter_dir must be an absolute path"),
    ],
)
def test_bad_record_options_are_checked(query, message):
    from spark_receivers.cli.sources import parse_source
    from spark_receivers.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        parse_source(f"socket://127.0.0.1:9999?{query}")
