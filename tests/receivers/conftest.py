"""Fixtures for the built-in receivers' tests: the real servers they talk to."""

from __future__ import annotations

from service_fixtures import amqp_url, mosquitto_port, nats_url, redis_url

__all__ = ["amqp_url", "mosquitto_port", "nats_url", "redis_url"]
