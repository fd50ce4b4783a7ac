"""``--source`` URIs: one built-in receiver each, checked before Spark starts.

=====================================  ==============================================
``socket://host:port``                 lines from a TCP server (SocketTextReceiver);
                                       ``?coalesce=50ms`` (0: store every read)
``http://[host][:port][/path]``        POSTed lines or JSON lines (HttpReceiver);
                                       ``?token=`` (or ``SPARK_RECEIVERS_HTTP_TOKEN``),
                                       ``?format=lines|json``; no host: the executor's
``file:///abs/dir``                    lines appended to a directory's files
                                       (FileTailReceiver); ``?pattern=*.log``
``redis[s]://[[user]:pw@]host[:port]   a Redis stream through a consumer group
/[db/]stream?group=g``                 (RedisStreamReceiver); ``?field=``; a leading
                                       number in the path is the db (``?stream=`` for
                                       a stream whose name is a number)
``mqtt[s]://[user:pw@]host[:port]      an MQTT topic (MqttReceiver), QoS 1 by default;
/topic``                               ``?qos=``, ``?client_id=``
``amqp[s]://user:pw@host[:port]        an AMQP queue (AmqpReceiver), acked after the
/[vhost]?queue=q``                      store; ``?prefetch=``, ``?max_batch=``,
                                       ``?batch_wait=``, ``?heartbeat=``; the vhost
                                       percent-encoded (``%2F`` or nothing: ``/``)
``nats://[user:pw@]host[:port]         a JetStream stream through a durable pull
?stream=s``                            consumer (NatsReceiver); ``?durable=``,
                                       ``?subject=``, ``?deliver=all|new``,
                                       ``?ack_wait=``, ``?max_deliver=``, ``?token=``
``ws[s]://host[:port]/path``           a WebSocket feed (WebSocketReceiver), at most
                                       once; ``?subscribe=`` (sent on every
                                       connection), ``?ping_interval=``,
                                       ``?ping_timeout=``; every other parameter is
                                       the feed's own and goes to the server
``generator://?rate=N``                generated lines, for trying things out
=====================================  ==============================================

Ports, when given, must be 1-65535 (a default is used only when the URI has none:
8080, 6379, 1883/8883, 5672/5671, 4222, 80/443). Unknown parameters are refused
(but ``ws[s]://``, whose other parameters belong to the feed). ``rediss://`` and
``mqtts://`` connect over TLS (``?ca_certs=``, ``?certfile=``, ``?keyfile=``).
Every source but ``generator://`` takes ``?include_timestamp=true`` (an arrival-time
column ``timestamp``), ``?bad_record_policy=skip|fail|dead_letter``,
``?dead_letter_dir=/abs/dir`` and ``?max_record_bytes=`` (``512k``, ``4m``: a longer
record is a bad record; docs/receivers.md); ``mqtt[s]://`` also
``?clean_session=``, ``?protocol=5|3.1.1`` and ``?session_expiry=``.
Passwords and tokens never appear in :attr:`Source.display`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from spark_receivers.cli.broker_sources import amqp, nats, ws
from spark_receivers.cli.source_spec import (
    RECORD_PARAMS,
    TLS_PARAMS,
    Source,
    host_of,
    record_options,
    tls_files,
)
from spark_receivers.cli.uri import MASK, ParsedUri, parse_uri
from spark_receivers.errors import ConfigError
from spark_receivers.receiver.receiver import Receiver

__all__ = ["HTTP_TOKEN_ENV", "SCHEMES", "Source", "parse_source"]

SCHEMES = (
    *("socket", "http", "file", "redis", "rediss", "mqtt", "mqtts"),
    *("amqp", "amqps", "nats", "ws", "wss", "generator"),
)
HTTP_TOKEN_ENV = "SPARK_RECEIVERS_HTTP_TOKEN"


def parse_source(uri: str, environ: Mapping[str, str] | None = None) -> Source:
    """The :class:`Source` ``uri`` names; :class:`ConfigError` (one line) otherwise."""
    u = parse_uri(uri, SCHEMES)
    build = _BUILDERS[u.scheme]
    try:
        return build(u, os.environ if environ is None else environ)
    except ConfigError as e:
        if str(e).startswith("source "):
            raise
        u.fail(str(e))  # a receiver refused one of its options


def _no_userinfo(u: ParsedUri) -> None:
    if u.username is not None or u.password is not None:
        u.fail(f"{u.scheme}:// takes no user or password")


def _socket(u: ParsedUri, environ: Mapping[str, str]) -> Source:
    from spark_receivers.receivers.socket_text import SocketTextReceiver

    u.check_params((*RECORD_PARAMS, "coalesce"))
    _no_userinfo(u)
    host = host_of(u, "socket://host:port")
    if u.port is None:
        u.fail("needs a port: socket://host:port")
    kwargs: dict[str, Any] = record_options(u)
    coalesce_s = u.duration_s("coalesce", "ms")
    if coalesce_s is not None:
        if coalesce_s > 1:
            u.fail(f"parameter coalesce must be at most 1s (0: no wait), got {coalesce_s:g}s")
        kwargs["coalesce_ms"] = coalesce_s * 1000
    receiver = SocketTextReceiver(host, u.port, **kwargs)
    return Source(u.display, u.scheme, receiver, None, server=(host, u.port))


def _http(u: ParsedUri, environ: Mapping[str, str]) -> Source:
    from spark_receivers.receivers.http import HttpReceiver

    u.check_params(
        (
            "token",
            "format",
            "max_body_bytes",
            "max_store_wait",
            "max_concurrent_stores",
            *RECORD_PARAMS,
        )
    )
    _no_userinfo(u)
    token = u.text("token")
    if token == "":
        u.fail("parameter token is empty (leave it out for no token)")
    token = token or environ.get(HTTP_TOKEN_ENV) or None
    port = 8080 if u.port is None else u.port
    kwargs: dict[str, Any] = {"format": u.choice("format", ("lines", "json"), "lines")}
    kwargs.update(record_options(u))
    if "max_body_bytes" in u.params:
        kwargs["max_body_bytes"] = u.integer("max_body_bytes")
    if "max_concurrent_stores" in u.params:
        kwargs["max_concurrent_stores"] = u.integer("max_concurrent_stores")
    wait_s = u.duration_s("max_store_wait", "s")
    if wait_s is not None:
        kwargs["max_store_wait_s"] = wait_s
    host = u.host or None  # no host: the executor's own address
    receiver = HttpReceiver(host, port, path=u.path or "/ingest", token=token, **kwargs)
    shown = (("token", MASK if token else "none"),)
    ack = "an HTTP 200 to the client"
    return Source(u.display, u.scheme, receiver, ack, listen=(host, port), extra=shown)


def _file(u: ParsedUri, environ: Mapping[str, str]) -> Source:
    from spark_receivers.receivers.file_tail import FileTailReceiver

    u.check_params(
        (
            "pattern",
            "start_at",
            "offsets_dir",
            "offsets_name",
            "poll_interval",
            *RECORD_PARAMS,
        )
    )
    _no_userinfo(u)
    if u.host not in ("", "localhost") or u.port is not None or not os.path.isabs(u.path):
        relative = u.host + u.path if u.host not in ("", "localhost") else u.path
        hint = os.path.abspath(relative) if relative else ""
        u.fail(
            "a file source needs an absolute directory: file:///path/to/dir (three slashes)"
            + (f"; did you mean file://{hint} ?" if hint else "")
        )
    directory = os.path.normpath(u.path)
    kwargs: dict[str, Any] = {"start_at": u.choice("start_at", ("beginning", "end"), "beginning")}
    kwargs.update(record_options(u))
    if "offsets_dir" in u.params:
        offsets_dir = u.params["offsets_dir"]
        if not os.path.isabs(offsets_dir):
            u.fail(f"parameter offsets_dir must be an absolute path, got {offsets_dir!r}")
        kwargs["offsets_dir"] = offsets_dir
    if "offsets_name" in u.params:
        kwargs["offsets_name"] = u.params["offsets_name"]
    poll_s = u.duration_s("poll_interval", "ms")
    if poll_s is not None:
        kwargs["poll_interval_ms"] = round(poll_s * 1000)
    receiver = FileTailReceiver(directory, u.text("pattern", "*") or "*", **kwargs)
    return Source(u.display, u.scheme, receiver, "a saved read offset", directory=directory)


def _redis(u: ParsedUri, environ: Mapping[str, str]) -> Source:
    from urllib.parse import quote

    from spark_receivers.receivers.redis_stream import RedisStreamReceiver

    tls = u.scheme == "rediss"
    u.check_params(
        ("group", "stream", "db", "field", "consumer", "batch", "block", "claim_min_idle")
        + ("group_start_id", *RECORD_PARAMS)
        + ((*TLS_PARAMS, "cert_reqs") if tls else ())
    )
    example = f"{u.scheme}://host:port/[db/]stream?group=g"
    host = host_of(u, example)
    port = 6379 if u.port is None else u.port
    segments = [s for s in u.path.split("/") if s]
    db = u.integer("db", None, minimum=0)
    if segments and segments[0].isdigit():  # a leading number is the db, as in Redis URLs
        if db is not None:
            u.fail("the db is given twice (path and ?db=)")
        db = int(segments.pop(0))
    stream = "/".join(segments) or None
    if stream and "stream" in u.params:
        u.fail("the stream is given twice (path and ?stream=)")
    stream = stream or u.text("stream")
    group = u.text("group")
    if not stream or not group:
        u.fail(f"needs a stream and a group: {example}")
    userinfo = ""
    if u.username is not None or u.password is not None:
        userinfo = quote(u.username or "", safe="")
        if u.password is not None:
            userinfo += ":" + quote(u.password, safe="")
        userinfo += "@"
    netloc = f"[{host}]" if ":" in host else host
    url = f"{u.scheme}://{userinfo}{netloc}:{port}/{db or 0}"
    if tls:
        query = [f"ssl_{k}={quote(v, safe='/')}" for k, v in tls_files(u).items()]
        if "cert_reqs" in u.params:
            reqs = u.choice("cert_reqs", ("none", "optional", "required"), "required")
            query.append(f"ssl_cert_reqs={reqs}")
        if query:
            url += "?" + "&".join(query)
    field = u.text("field", "value")
    kwargs: dict[str, Any] = {"url": url, "field": field or None, **record_options(u)}
    for name in ("consumer", "group_start_id"):
        if name in u.params:
            kwargs[name] = u.params[name]
    if "batch" in u.params:
        kwargs["batch"] = u.integer("batch")
    for name, key in (("block", "block_ms"), ("claim_min_idle", "claim_min_idle_ms")):
        seconds = u.duration_s(name, "ms")
        if seconds is not None:
            kwargs[key] = round(seconds * 1000)
    receiver = RedisStreamReceiver(stream, group, **kwargs)
    return Source(u.display, u.scheme, receiver, "an XACK", server=(host, port))


def _mqtt(u: ParsedUri, environ: Mapping[str, str]) -> Source:
    from spark_receivers.receivers.mqtt import MqttReceiver

    tls = u.scheme == "mqtts"
    u.check_params(
        ("qos", "client_id", "keepalive", "max_batch", "batch_wait")
        + ("clean_session", "protocol", "session_expiry", *RECORD_PARAMS)
        + (TLS_PARAMS if tls else ())
    )
    host = host_of(u, f"{u.scheme}://host:port/topic")
    port = (8883 if tls else 1883) if u.port is None else u.port
    topic = u.path[1:] if u.path.startswith("/") else u.path
    if not topic:
        u.fail(f"needs a topic: {u.scheme}://host:port/topic (sensors/+/temp, logs/#)")
    qos = int(u.choice("qos", ("0", "1", "2"), "1"))
    kwargs: dict[str, Any] = {"qos": qos, "username": u.username, "password": u.password}
    kwargs.update(record_options(u))
    if "clean_session" in u.params:
        kwargs["clean_session"] = u.choice("clean_session", ("true", "false"), "") == "true"
    kwargs["protocol"] = u.choice("protocol", ("5", "3.1.1"), "5")
    expiry_s = u.duration_s("session_expiry", "s")
    if expiry_s is not None:
        kwargs["session_expiry_s"] = round(expiry_s)
    # The broker keeps a persistent session per client id: ?client_id= names it.
    if "client_id" in u.params:
        if not u.params["client_id"]:
            u.fail("parameter client_id is empty")
        kwargs["client_id"] = u.params["client_id"]
    if "max_batch" in u.params:
        kwargs["max_batch"] = u.integer("max_batch")
    keepalive_s = u.duration_s("keepalive", "s")
    if keepalive_s is not None:
        kwargs["keepalive_s"] = max(1, round(keepalive_s))
    wait_s = u.duration_s("batch_wait", "ms")
    if wait_s is not None:
        kwargs["batch_wait_ms"] = max(1, round(wait_s * 1000))
    receiver: Receiver
    if tls:
        from spark_receivers.receivers.mqtt_tls import MqttTlsReceiver

        receiver = MqttTlsReceiver(host, port, topic, **tls_files(u), **kwargs)
    else:
        receiver = MqttReceiver(host, port, topic, **kwargs)
    ack = "a PUBACK" if qos > 0 else None
    return Source(u.display, u.scheme, receiver, ack, server=(host, port))


def _generator(u: ParsedUri, environ: Mapping[str, str]) -> Source:
    from spark_receivers.receivers.generator import GeneratorReceiver

    u.check_params(("rate", "total", "line_bytes", "seed"))
    _no_userinfo(u)
    if u.host or u.port is not None or u.path not in ("", "/"):
        u.fail("generator:// takes only parameters: generator://?rate=1000")
    receiver = GeneratorReceiver(
        rate=u.number("rate", 1000.0),
        total=u.integer("total", None, minimum=0),
        line_bytes=u.integer("line_bytes", 100) or 100,
        seed=u.integer("seed", 7, minimum=0) or 0,
    )
    return Source(u.display, u.scheme, receiver, None)


_BUILDERS: dict[str, Callable[[ParsedUri, Mapping[str, str]], Source]] = {
    "socket": _socket,
    "http": _http,
    "file": _file,
    "redis": _redis,
    "rediss": _redis,
    "mqtt": _mqtt,
    "mqtts": _mqtt,
    "amqp": amqp,
    "amqps": amqp,
    "nats": nats,
    "ws": ws,
    "wss": ws,
    "generator": _generator,
}
