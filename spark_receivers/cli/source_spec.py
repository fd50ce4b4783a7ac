"""What a parsed ``--source`` is (:class:`Source`) and the parameters every source shares.

Shared by :mod:`spark_receivers.cli.sources` and :mod:`spark_receivers.cli.broker_sources`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from spark_receivers.cli.uri import MASK, ParsedUri, mask_uri
from spark_receivers.receiver.receiver import Receiver

__all__ = [
    "RECORD_PARAMS",
    "TLS_PARAMS",
    "Source",
    "host_of",
    "record_options",
    "tls_files",
]

TLS_PARAMS = ("ca_certs", "certfile", "keyfile")
RECORD_PARAMS = ("include_timestamp", "bad_record_policy", "dead_letter_dir", "max_record_bytes")
"""What every source's receiver takes: an arrival-time column, its bad-record policy, and
the longest record it takes (bytes; default spark.receivers.receiver.maxRecordBytes)."""
SHOWN_ATTRS = (
    *("host", "port", "path", "format", "directory", "pattern", "start_at", "stream", "group"),
    *("url", "field", "topic", "qos", "client_id", "username", "password", "rate", "total"),
    *("queue", "durable", "subject", "subscribe"),
    *TLS_PARAMS,
)


@dataclass(frozen=True)
class Source:
    """A parsed ``--source``: its receiver and what the CLI checks and says about it."""

    display: str
    """The URI with its secrets masked: the only form ever printed."""
    scheme: str
    receiver: Receiver
    acknowledgement: str | None
    """What the source is told once records are stored ("an XACK"); None: nothing."""
    listen: tuple[str | None, int] | None = None
    """``(host, port)`` the receiver listens on (None host: the executor's address)."""
    server: tuple[str, int] | None = None
    """``(host, port)`` of the server the receiver connects to."""
    directory: str | None = None
    """The directory a file source tails."""
    extra: tuple[tuple[str, str], ...] = ()
    """Settings :meth:`describe` shows that are not receiver attributes (masked)."""

    def describe(self) -> str:
        """The receiver and its main settings, secrets masked (what ``--check`` prints)."""
        attrs = vars(self.receiver)
        parts = []
        for name in SHOWN_ATTRS:
            if name in attrs and attrs[name] is not None:
                value = attrs[name]
                if name == "password":
                    value = MASK
                elif name == "url":
                    value = mask_uri(value)
                parts.append(f"{name}={value!r}")
        parts += [f"{k}={v}" for k, v in self.extra]
        return f"{type(self.receiver).__name__}({', '.join(parts)})"


def host_of(u: ParsedUri, example: str) -> str:
    """The URI's host; a :class:`ConfigError` showing ``example`` when it has none."""
    if not u.host:
        u.fail(f"needs a host: {example}")
    return u.host


def record_options(u: ParsedUri) -> dict[str, Any]:
    """The :data:`RECORD_PARAMS` given, as receiver keyword arguments."""
    kwargs: dict[str, Any] = {}
    if "include_timestamp" in u.params:
        kwargs["include_timestamp"] = u.choice("include_timestamp", ("true", "false"), "") == "true"
    if "bad_record_policy" in u.params:
        policies = ("skip", "fail", "dead_letter")
        kwargs["bad_record_policy"] = u.choice("bad_record_policy", policies, "skip")
    if "dead_letter_dir" in u.params:
        path = u.params["dead_letter_dir"]
        if not os.path.isabs(path):
            u.fail(f"parameter dead_letter_dir must be an absolute path, got {path!r}")
        kwargs["dead_letter_dir"] = path
    if "max_record_bytes" in u.params:
        kwargs["max_record_bytes"] = u.size("max_record_bytes")
    return kwargs


def tls_files(u: ParsedUri) -> dict[str, str]:
    """The :data:`TLS_PARAMS` given, each an absolute path."""
    files = {name: u.params[name] for name in TLS_PARAMS if name in u.params}
    for name, path in files.items():
        if not os.path.isabs(path):
            u.fail(f"parameter {name} must be an absolute path, got {path!r}")
    return files
