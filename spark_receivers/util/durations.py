"""One duration syntax for every key and flag: Spark's (``200ms``, ``2s``, ``1min``, ``1h``).

A number with an optional unit: ``us``, ``ms``, ``s``, ``m``/``min``, ``h``, ``d``
(and their long forms ``sec``, ``secs``, ``mins``, ``hours``, ``days``). A bare
number is in the key's own unit (``default_unit``), as Spark reads
``spark.streaming.blockInterval=200`` as milliseconds.
"""

from __future__ import annotations

import math
import re

from spark_receivers.errors import ConfigError

__all__ = ["UNITS_S", "parse_duration", "parse_duration_ms"]

UNITS_S = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
"""Seconds per unit."""

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*$")


def parse_duration(raw: str, what: str, default_unit: str = "s") -> float:
    """``raw`` in seconds; :class:`ConfigError` naming ``what`` (a key or a flag) otherwise.

    >>> parse_duration("1.5s", "--seconds"), parse_duration("200", "k", "ms")
    (1.5, 0.2)
    """
    m = _DURATION.match(str(raw).lower())
    unit = (m.group(2) or default_unit) if m else ""
    if m is None or unit not in UNITS_S:
        msg = (
            f"{what} must be a duration such as 500ms, 2s, 1min or 1h "
            f"(a bare number is in {default_unit}), got {raw!r}"
        )
        raise ConfigError(msg)
    seconds = float(m.group(1)) * UNITS_S[unit]
    if not math.isfinite(seconds):
        msg = f"{what} must be a finite duration, got {raw!r}"
        raise ConfigError(msg)
    return seconds


def parse_duration_ms(raw: str, what: str, default_unit: str = "ms") -> int:
    """``raw`` in whole milliseconds (see :func:`parse_duration`)."""
    return round(parse_duration(raw, what, default_unit) * 1000)
