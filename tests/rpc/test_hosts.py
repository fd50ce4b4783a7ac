"""local_host: the one answer to "which host do our servers bind to and advertise"."""

from __future__ import annotations

import socket

import pytest

from spark_receivers.rpc import hosts
from spark_receivers.rpc.hosts import local_host
from spark_receivers.rpc.transport import local_bind_host
from spark_receivers.spark.receiver_task import executor_host

DRIVER_CONF = {"spark.driver.bindAddress": "10.0.0.1", "spark.driver.host": "10.0.0.2"}


@pytest.fixture
def resolves_to(monkeypatch):
    def set_answer(answer):
        def gethostbyname(name):
            if isinstance(answer, BaseException):
                raise answer
            return answer

        monkeypatch.setattr(hosts.socket, "gethostbyname", gethostbyname)

    return set_answer


def test_spark_local_ip_wins_over_everything(resolves_to):
    resolves_to("10.9.9.9")
    env = {"SPARK_LOCAL_IP": "192.168.1.5"}
    assert local_host(DRIVER_CONF, environ=env) == "192.168.1.5"
    assert local_host(environ=env) == "192.168.1.5"


def test_the_driver_uses_its_bind_address_then_its_host(resolves_to):
    resolves_to("10.9.9.9")
    assert local_host(DRIVER_CONF, environ={}) == "10.0.0.1"
    assert local_host({"spark.driver.host": "10.0.0.2"}, environ={}) == "10.0.0.2"
    assert local_host({"spark.driver.bindAddress": ""}, environ={"SPARK_LOCAL_IP": ""}) == (
        "10.9.9.9"
    )


def test_otherwise_the_resolved_hostname_then_loopback(resolves_to):
    resolves_to("10.9.9.9")
    assert local_host(environ={}) == "10.9.9.9"
    resolves_to(socket.gaierror("no such host"))
    assert local_host(environ={}) == "127.0.0.1"


def test_the_driver_and_executor_entry_points_agree(monkeypatch, resolves_to):
    resolves_to("10.9.9.9")
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert executor_host() == local_host() == "10.9.9.9"
    assert local_bind_host(DRIVER_CONF) == "10.0.0.1"
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    assert executor_host() == local_bind_host(DRIVER_CONF) == "127.0.0.1"
