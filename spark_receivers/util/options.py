"""Checks of a receiver's constructor options, shared by the built-in receivers."""

from __future__ import annotations

from spark_receivers.errors import ConfigError


def require_positive_ints(**values: object) -> None:
    """Raise :class:`ConfigError` naming the first option that is not an integer > 0."""
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            msg = f"{key} must be an integer > 0, got {value!r}"
            raise ConfigError(msg)


def require_positive_numbers(**values: object) -> None:
    """Raise :class:`ConfigError` naming the first option that is not a number > 0."""
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            msg = f"{key} must be a number > 0, got {value!r}"
            raise ConfigError(msg)
