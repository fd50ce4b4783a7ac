"""Session fixtures for the real servers the receivers talk to (redis, mosquitto, amqp, nats).

Each server is started once per test session through scripts/services.sh (which
installs it with apt-get when missing) in a state folder of this session, on a
free port of 127.0.0.1, and stopped at the end. The fixtures are per test: each
checks that its server still listens and starts it again (its port, its data)
when it does not. A test that needs a server fails, never skips, when the server
cannot be started.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from spark_receivers.testing import _listening  # the loopback probe of the Connect server's start

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"
_lock = threading.Lock()
_ports: dict[str, int] = {}
_state_dir = tempfile.mkdtemp(prefix="spark-receivers-services-")


def _env() -> dict[str, str]:
    return {**os.environ, "SPARK_RECEIVERS_SERVICES_DIR": _state_dir}


def _services(name: str, command: str, *args: str, timeout_s: float = 600) -> str:
    """``scripts/services.sh COMMAND NAME ARGS``; its stdout (pytest.fail when it fails)."""
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT), command, name, *args],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"cannot run {SCRIPT} {command} {name}: {e}")
    if done.returncode != 0:
        pytest.fail(
            f"{name} could not be started by scripts/services.sh {command} (exit "
            f"{done.returncode}); the tests of its receiver need a real {name}.\n"
            f"{done.stderr[-2000:]}"
        )
    return done.stdout


def start_service(name: str) -> int:
    """Start ``name`` once for the session; return its port (pytest.fail when it can't).

    A server started before that no longer listens (a test's restart of it failed, or it
    died) is started again on its port, with its data where it keeps any, so that one
    test's failure does not fail every later test of that server: on 2026-11-29 a RabbitMQ
    restart that timed out beside a CPU hog failed seven more AMQP tests of the session.
    """
    with _lock:
        if name in _ports:
            if _listening(_ports[name]):
                return _ports[name]
            again = "restart" if name in ("redis", "amqp", "nats") else "start"
            _services(name, again, str(_ports[name]))
            return _ports[name]
        port = int(_services(name, "start").strip().splitlines()[-1])
        _ports[name] = port
        if len(_ports) == 1:
            atexit.register(stop_all)
        return port


def restart_service(name: str) -> None:
    """Stop ``name`` and start it again on the same port with its data (redis, amqp, nats).

    Bounded by scripts/services.sh itself (its stop and its wait for the port: at most
    ~5 min for RabbitMQ beside a CPU hog), so that a failure reports the server's log;
    a test that restarts a server needs a ``timeout`` mark above that.
    """
    with _lock:
        _services(name, "restart", timeout_s=420)


def login(name: str) -> tuple[str, str]:
    """The user and password scripts/services.sh gave broker ``name`` (amqp, nats)."""
    folder = Path(_state_dir) / name
    return (folder / "user").read_text().strip(), (folder / "password").read_text().strip()


def stop_all() -> None:
    with _lock:
        if not _ports:
            return
        subprocess.run(
            ["bash", str(SCRIPT), "stop", "all"], env=_env(), capture_output=True, check=False
        )
        _ports.clear()


@pytest.fixture
def redis_url() -> str:
    """``redis://127.0.0.1:<port>/0`` of the session's redis-server."""
    return f"redis://127.0.0.1:{start_service('redis')}/0"


@pytest.fixture
def mosquitto_port() -> int:
    """The port of the session's mosquitto on 127.0.0.1."""
    return start_service("mosquitto")


@pytest.fixture
def amqp_url() -> str:
    """``amqp://user:password@127.0.0.1:<port>/%2F`` of the session's RabbitMQ (no guest)."""
    port = start_service("amqp")
    user, password = login("amqp")
    url = f"amqp://{user}:{password}@127.0.0.1:{port}/%2F"
    _wait_for_amqp_login(url, 60)
    return url


def _wait_for_amqp_login(url: str, seconds: float) -> None:
    """Log in once (bounded retries) before a test uses the broker.

    A listening RabbitMQ may still close a connection unanswered (booting, or a moment
    under load); a fresh clone's run of 2026-11-30 failed a test's setup on one such
    close. The test's subject is our receiver, not the broker's readiness: retry here,
    and fail the test with the last error when the broker never takes a login.
    """
    import pika  # only the AMQP tests need it

    deadline = time.monotonic() + seconds
    while True:
        try:
            pika.BlockingConnection(pika.URLParameters(url)).close()
            return
        except pika.exceptions.AMQPError as e:
            if time.monotonic() >= deadline:
                where = url.rsplit("@", 1)[1]
                pytest.fail(f"RabbitMQ on {where} took no login in {seconds} s: {e!r}")
            time.sleep(0.5)


@pytest.fixture
def nats_url() -> str:
    """``nats://user:password@127.0.0.1:<port>`` of the session's nats-server (JetStream on)."""
    port = start_service("nats")
    user, password = login("nats")
    return f"nats://{user}:{password}@127.0.0.1:{port}"
