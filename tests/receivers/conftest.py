"""Fixtures for the built-in receivers' tests: the real servers they talk to."""

from __future__ import annotations

from service_fixtures import mosquitto_port, redis_url

__all__ = ["mosquitto_port", "redis_url"]
