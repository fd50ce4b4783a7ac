"""The servers' fixtures: a server that stopped is started again for the next test."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import redis
import service_fixtures
from service_fixtures import redis_url  # noqa: F401


def test_a_server_that_died_is_started_again_on_its_port_with_its_data(redis_url):  # noqa: F811
    """One test's failed restart (or a crash) must not fail every later test of the server."""
    client = redis.Redis.from_url(redis_url)
    client.set("kept", "yes")
    client.close()
    pid = int((Path(service_fixtures._state_dir) / "redis" / "pid").read_text())
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    os.kill(pid, signal.SIGTERM)  # redis writes its append-only file whole at SIGTERM
    deadline = time.monotonic() + 30
    while service_fixtures._listening(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not service_fixtures._listening(port), "redis did not stop"

    assert service_fixtures.start_service("redis") == port
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.get("kept") == b"yes"
    finally:
        client.close()
