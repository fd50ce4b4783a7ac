"""The broker and feed ``--source`` URIs: ``amqp[s]://``, ``nats://``, ``ws[s]://``.

Their table and rules are in :mod:`spark_receivers.cli.sources`, which dispatches here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_receivers.cli.source_spec import (
    RECORD_PARAMS,
    TLS_PARAMS,
    Source,
    host_of,
    record_options,
    tls_files,
)
from spark_receivers.cli.uri import MASK, ParsedUri, mask_uri
from spark_receivers.errors import ConfigError

__all__ = ["amqp", "nats", "ws"]


def _userinfo(u: ParsedUri) -> str:
    """``user:password@`` of ``u``, percent-encoded again ('' when it has none)."""
    from urllib.parse import quote

    if u.username is None and u.password is None:
        return ""
    info = quote(u.username or "", safe="")
    if u.password is not None:
        info += ":" + quote(u.password, safe="")
    return info + "@"


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def amqp(u: ParsedUri, environ: Mapping[str, str]) -> Source:
    """``amqp[s]://user:pw@host[:port]/[vhost]?queue=q``: an :class:`AmqpReceiver`."""
    from urllib.parse import quote

    from spark_receivers.receivers.amqp import AmqpReceiver

    tls = u.scheme == "amqps"
    u.check_params(("queue", "prefetch", "max_batch", "batch_wait", "heartbeat", *RECORD_PARAMS))
    example = f"{u.scheme}://user:password@host:port/vhost?queue=q"
    host = host_of(u, example)
    port = (5671 if tls else 5672) if u.port is None else u.port
    queue = u.text("queue")
    if not queue:
        u.fail(f"needs a queue: {example}")
    vhost = u.path[1:] if u.path.startswith("/") else u.path
    vhost = vhost or "/"
    url = f"{u.scheme}://{_userinfo(u)}{_netloc(host, port)}/{quote(vhost, safe='')}"
    kwargs: dict[str, Any] = record_options(u)
    if "prefetch" in u.params:
        kwargs["prefetch"] = u.integer("prefetch")
    if "max_batch" in u.params:
        kwargs["max_batch"] = u.integer("max_batch")
    wait_s = u.duration_s("batch_wait", "ms")
    if wait_s is not None:
        kwargs["batch_wait_ms"] = max(1, round(wait_s * 1000))
    heartbeat_s = u.duration_s("heartbeat", "s")
    if heartbeat_s is not None:
        kwargs["heartbeat_s"] = max(1, round(heartbeat_s))
    receiver = AmqpReceiver(url, queue, **kwargs)
    return Source(u.display, u.scheme, receiver, "a basic.ack", server=(host, port))


def nats(u: ParsedUri, environ: Mapping[str, str]) -> Source:
    """``nats://[user:pw@]host[:port]?stream=s``: a :class:`NatsReceiver`."""
    from spark_receivers.receivers.nats_jetstream import NatsReceiver

    u.check_params(
        (
            *("stream", "durable", "subject", "deliver", "ack_wait", "max_deliver", "token"),
            *("max_batch", "fetch_wait", *RECORD_PARAMS),
        )
    )
    if u.username is not None and u.password is None:
        # nats://TOKEN@host: the token would be printed wherever the URI is; refuse it unshown
        where = f"nats://***@{u.raw.split('@')[-1]}"
        msg = f"source {mask_uri(where)}: a token goes in ?token= (masked), not before the '@'"
        raise ConfigError(msg)
    example = "nats://user:password@host:port?stream=s"
    host = host_of(u, example)
    port = 4222 if u.port is None else u.port
    if u.path not in ("", "/"):
        u.fail(f"takes no path: {example}")
    stream = u.text("stream")
    if not stream:
        u.fail(f"needs a stream: {example}")
    token = u.text("token")
    if token == "":
        u.fail("parameter token is empty (leave it out for no token)")
    url = f"nats://{_userinfo(u)}{_netloc(host, port)}"
    kwargs: dict[str, Any] = {"token": token, **record_options(u)}
    for name in ("durable", "subject"):
        if name in u.params:
            kwargs[name] = u.params[name]
    kwargs["deliver"] = u.choice("deliver", ("all", "new"), "all")
    ack_wait_s = u.duration_s("ack_wait", "s")
    if ack_wait_s is not None:
        kwargs["ack_wait_s"] = ack_wait_s
    if "max_deliver" in u.params:
        kwargs["max_deliver"] = u.integer("max_deliver")
    if "max_batch" in u.params:
        kwargs["max_batch"] = u.integer("max_batch")
    fetch_s = u.duration_s("fetch_wait", "ms")
    if fetch_s is not None:
        kwargs["fetch_wait_ms"] = max(1, round(fetch_s * 1000))
    receiver = NatsReceiver(url, stream, **kwargs)
    shown = (("token", MASK),) if token else ()
    ack = "a JetStream ack"
    return Source(u.display, u.scheme, receiver, ack, server=(host, port), extra=shown)


WS_PARAMS = ("subscribe", "ping_interval", "ping_timeout", "max_batch", "batch_wait")


def ws(u: ParsedUri, environ: Mapping[str, str]) -> Source:
    """``ws[s]://host[:port]/path``: a :class:`WebSocketReceiver`; other parameters: the feed's."""
    from urllib.parse import quote, urlencode

    from spark_receivers.receivers.websocket import WebSocketReceiver

    tls = u.scheme == "wss"
    ours = set(WS_PARAMS + RECORD_PARAMS + (TLS_PARAMS[:1] if tls else ()))
    host = host_of(u, f"{u.scheme}://host:port/path")
    port = (443 if tls else 80) if u.port is None else u.port
    feed_params = {k: v for k, v in u.params.items() if k not in ours}
    url = f"{u.scheme}://{_userinfo(u)}{_netloc(host, port)}{quote(u.path or '/', safe='/')}"
    if feed_params:
        url += "?" + urlencode(feed_params)
    kwargs: dict[str, Any] = record_options(u)
    if "subscribe" in u.params:
        if not u.params["subscribe"]:
            u.fail("parameter subscribe is empty (leave it out for no subscription message)")
        kwargs["subscribe"] = u.params["subscribe"]
    for name in ("ping_interval", "ping_timeout"):
        seconds = u.duration_s(name, "s")
        if seconds is not None:
            if seconds <= 0:
                u.fail(f"parameter {name} must be > 0")
            kwargs[f"{name}_s"] = seconds
    if "max_batch" in u.params:
        kwargs["max_batch"] = u.integer("max_batch")
    wait_s = u.duration_s("batch_wait", "ms")
    if wait_s is not None:
        kwargs["batch_wait_ms"] = max(1, round(wait_s * 1000))
    if tls and "ca_certs" in u.params:
        kwargs["ca_certs"] = tls_files(u)["ca_certs"]
    receiver = WebSocketReceiver(url, **kwargs)
    return Source(u.display, u.scheme, receiver, None, server=(host, port))
