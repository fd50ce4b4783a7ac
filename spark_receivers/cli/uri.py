"""Source URIs taken apart strictly: authority, port, path, query, and secrets masked.

Nothing here guesses: a port out of range, an empty port, a parameter given twice
or one the scheme does not know is a :class:`ConfigError` naming the URI (masked)
and what to write instead. No Spark, no network.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import NoReturn
from urllib.parse import parse_qsl, unquote, urlsplit

from spark_receivers.config_checks import parse_size
from spark_receivers.errors import ConfigError
from spark_receivers.util.durations import parse_duration

__all__ = ["MASK", "ParsedUri", "mask_uri", "parse_uri"]

MASK = "***"
SECRET_PARAMS = ("token", "password", "secret")
"""Query parameters whose values are never printed."""

# The password runs to the last '@' of the authority (a raw '@' in it must not leak a tail).
_USERINFO_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^/?#@:]*):[^/?#]*@", re.IGNORECASE)
_SECRET_QUERY = re.compile(r"([?&](?:" + "|".join(SECRET_PARAMS) + r")=)[^&#]*", re.IGNORECASE)


def mask_uri(uri: str) -> str:
    """``uri`` with its password and secret query values replaced by ``***``.

    Works on any string, parseable or not, so that error messages may quote it.

    >>> mask_uri("redis://:pw@host:6380/2/s?group=g")
    'redis://:***@host:6380/2/s?group=g'
    >>> mask_uri("http://127.0.0.1:8090/ingest?token=s3cret&format=json")
    'http://127.0.0.1:8090/ingest?token=***&format=json'
    """
    masked = _USERINFO_PASSWORD.sub(lambda m: f"{m.group(1)}:{MASK}@", uri)
    return _SECRET_QUERY.sub(lambda m: f"{m.group(1)}{MASK}", masked)


@dataclass(frozen=True)
class ParsedUri:
    """A source URI's parts, percent-decoded; ``display`` is safe to print."""

    raw: str
    scheme: str
    username: str | None
    password: str | None
    host: str
    """'' when the URI has none."""
    port: int | None
    """None when the URI has none; else 1-65535 (checked)."""
    path: str
    params: dict[str, str] = field(default_factory=dict)

    @property
    def display(self) -> str:
        """The URI with its secrets masked."""
        return mask_uri(self.raw)

    def fail(self, problem: str) -> NoReturn:
        """Raise :class:`ConfigError` ``source <uri>: <problem>`` (the URI masked)."""
        msg = f"source {self.display}: {problem}"
        raise ConfigError(msg) from None

    # --- parameters ---------------------------------------------------------------

    def check_params(self, allowed: tuple[str, ...]) -> None:
        """Refuse any query parameter not in ``allowed``, listing those that are."""
        unknown = sorted(set(self.params) - set(allowed))
        if unknown:
            known = ", ".join(allowed) if allowed else "none"
            self.fail(
                f"unknown parameter(s) {', '.join(unknown)} for {self.scheme}:// "
                f"(it takes: {known})"
            )

    def text(self, name: str, default: str | None = None) -> str | None:
        """The raw value of ``name`` (``default`` when absent)."""
        return self.params.get(name, default)

    def integer(self, name: str, default: int | None = None, minimum: int = 1) -> int | None:
        """``name`` as an integer >= ``minimum``."""
        raw = self.params.get(name)
        if raw is None:
            return default
        if not re.fullmatch(r"[+-]?\d+", raw.strip()) or int(raw) < minimum:
            self.fail(f"parameter {name} must be an integer >= {minimum}, got {raw!r}")
        return int(raw)

    def size(self, name: str) -> int | None:
        """``name`` as a size in bytes (``4096``, ``512k``, ``4m``), or None when absent."""
        raw = self.params.get(name)
        if raw is None:
            return None
        try:
            return parse_size(raw, f"parameter {name}")
        except ConfigError as e:
            self.fail(str(e))

    def number(self, name: str, default: float | None = None) -> float | None:
        """``name`` as a finite number > 0."""
        raw = self.params.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            self.fail(f"parameter {name} must be a finite number > 0, got {raw!r}")
        return value

    def duration_s(self, name: str, default_unit: str) -> float | None:
        """``name`` as a duration (``500ms``, ``2s``, ``1min``) in seconds, or None."""
        raw = self.params.get(name)
        if raw is None:
            return None
        try:
            return parse_duration(raw, f"parameter {name}", default_unit)
        except ConfigError as e:
            self.fail(str(e))

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        """``name`` as one of ``choices``."""
        raw = self.params.get(name, default)
        if raw not in choices:
            self.fail(f"parameter {name} must be one of {', '.join(choices)}, got {raw!r}")
        return raw


def parse_uri(uri: str, schemes: tuple[str, ...]) -> ParsedUri:
    """Split ``uri``; its scheme must be one of ``schemes``; the port is checked (1-65535)."""
    raw = uri.strip()
    shown = mask_uri(raw)
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", raw)
    scheme = m.group(1).lower() if m else ""
    if scheme not in schemes:
        what = f"scheme {scheme!r}" if scheme else "no scheme"
        msg = f"unknown source {shown} ({what}): use one of {', '.join(s + '://' for s in schemes)}"
        raise ConfigError(msg)
    # An MQTT topic's multi-level wildcard is '#', which a URI would take as a fragment.
    raw_for_split = raw.replace("#", "%23") if scheme.startswith("mqtt") else raw
    try:
        parts = urlsplit(raw_for_split)
    except ValueError as e:
        msg = f"source {shown}: not a valid URI ({e})"
        raise ConfigError(msg) from None
    if parts.fragment:
        msg = f"source {shown}: a URI fragment ('#{parts.fragment}') means nothing here"
        raise ConfigError(msg)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    host, port = _host_port(hostport, shown)
    username = password = None
    if userinfo or "@" in parts.netloc:
        name, colon, secret = userinfo.partition(":")
        username = unquote(name)
        password = unquote(secret) if colon else None
    params: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in params:
            msg = f"source {shown}: parameter {key} is given twice"
            raise ConfigError(msg)
        params[key] = value
    return ParsedUri(
        raw=raw,
        scheme=scheme,
        username=username,
        password=password,
        host=host,
        port=port,
        path=unquote(parts.path),
        params=params,
    )


def _host_port(hostport: str, shown: str) -> tuple[str, int | None]:
    if hostport.startswith("["):  # [IPv6]:port
        close = hostport.find("]")
        if close < 0:
            msg = f"source {shown}: unterminated IPv6 address {hostport!r}"
            raise ConfigError(msg)
        host, rest = hostport[1:close], hostport[close + 1 :]
        if rest and not rest.startswith(":"):
            msg = f"source {shown}: unexpected {rest!r} after the IPv6 address"
            raise ConfigError(msg)
        port_text: str | None = rest[1:] if rest else None
    else:
        host, colon, port_text_ = hostport.partition(":")
        port_text = port_text_ if colon else None
    if port_text is None:
        return host.lower(), None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        hint = " (port 0, 'any free port', cannot be found by clients)" if port_text == "0" else ""
        msg = f"source {shown}: port must be an integer in 1-65535, got {port_text!r}{hint}"
        raise ConfigError(msg)
    return host.lower(), int(port_text)
