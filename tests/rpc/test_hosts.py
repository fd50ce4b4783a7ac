"""local_host: the one answer to "which host do our servers bind to and advertise"."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import ConfigError
from spark_receivers.rpc import hosts
from spark_receivers.rpc.hosts import local_host
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
    assert local_host(DRIVER_CONF) == "10.0.0.1"
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    assert executor_host() == local_host(DRIVER_CONF) == "127.0.0.1"


# --- the network keys: bind vs advertised host, port ranges -------------------------------


def test_the_driver_advertises_spark_driver_host_and_binds_its_bind_address():
    cfg = StreamingConfig()
    net = hosts.driver_network(cfg, DRIVER_CONF)
    assert (net.bind_host, net.advertise_host, net.ports) == ("10.0.0.1", "10.0.0.2", (0, 0))
    own = StreamingConfig(
        driver_host="driver.example", driver_bind_address="0.0.0.0", driver_ports="40000-40009"
    )
    net = hosts.driver_network(own, DRIVER_CONF)
    assert (net.bind_host, net.advertise_host, net.ports) == (
        "0.0.0.0",
        "driver.example",
        (40000, 40009),
    )


def test_the_driver_never_advertises_a_wildcard():
    with pytest.raises(
        ConfigError, match=r"spark.driver.host='0.0.0.0'.*spark.receivers.driver.host"
    ):
        hosts.driver_network(StreamingConfig(), {"spark.driver.host": "0.0.0.0"})
    with pytest.raises(ConfigError, match=r"spark.receivers.driver.host\) is advertised"):
        StreamingConfig(driver_host="0.0.0.0")
    with pytest.raises(ConfigError, match=r"spark.receivers.executor.host\) is advertised"):
        StreamingConfig.from_spark_conf({"spark.receivers.executor.host": "0.0.0.0"})


@pytest.mark.parametrize("raw", ["x", "40010-40000", "0-10", "70000", "1-2-3", ""])
def test_bad_port_ranges_name_the_key(raw):
    with pytest.raises(ConfigError, match=r"spark.receivers.executor.ports"):
        StreamingConfig.from_spark_conf({"spark.receivers.executor.ports": raw})


def test_executors_advertise_the_host_spark_knows_them_by(monkeypatch, resolves_to):
    # The Debian/Ubuntu trap: the hostname resolves to 127.0.1.1.
    resolves_to("127.0.1.1")
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setattr(hosts, "spark_executor_host", lambda: "10.1.2.3")
    net = hosts.executor_network(StreamingConfig(), "10.0.0.2")
    assert (net.bind_host, net.advertise_host) == ("10.1.2.3", "10.1.2.3")
    net = hosts.executor_network(
        StreamingConfig(executor_bind_address="0.0.0.0", executor_ports="41000-41003"), "10.0.0.2"
    )
    assert (net.bind_host, net.advertise_host, net.ports) == ("0.0.0.0", "10.1.2.3", (41000, 41003))
    net = hosts.executor_network(StreamingConfig(executor_host="node7.example"), "10.0.0.2")
    assert net.advertise_host == "node7.example"


def test_outside_an_executor_the_driver_host_when_local_else_the_route_to_it(
    monkeypatch, resolves_to
):
    resolves_to("127.0.1.1")
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setattr(hosts, "spark_executor_host", lambda: None)
    assert hosts.executor_network(StreamingConfig(), "127.0.0.1").advertise_host == "127.0.0.1"
    # A driver host that is not this machine's: the address we route to it from.
    monkeypatch.setattr(hosts, "_route_to", lambda host: "192.168.7.7")
    assert hosts.executor_network(StreamingConfig(), "10.200.0.1").advertise_host == "192.168.7.7"


def test_spark_executor_host_reads_the_executor_jvm_command_line(monkeypatch):
    monkeypatch.delenv("SPARK_EXECUTOR_POD_IP", raising=False)
    assert hosts.spark_executor_host() is None  # the test process is no executor's child
    monkeypatch.setenv("SPARK_EXECUTOR_POD_IP", "10.4.0.12")
    assert hosts.spark_executor_host() == "10.4.0.12"


def test_check_bindable_names_the_key():
    hosts.check_bindable("127.0.0.1", "k")
    with pytest.raises(ConfigError, match=r"spark.receivers.driver.bindAddress='203.0.113.9'"):
        hosts.check_bindable("203.0.113.9", "spark.receivers.driver.bindAddress")
    with pytest.raises(ConfigError, match="does not resolve"):
        hosts.check_bindable("no-such-host.invalid", "k")


# --- one literal address per server ------------------------------------------------------


@pytest.fixture
def names(monkeypatch):
    """Names resolving to what the test says (nothing else resolves)."""
    table = {
        "localhost": ("::1", "127.0.0.1"),
        "node7.example": ("10.0.0.7", "10.0.0.8"),
        "v6only.example": ("fd00::7",),
    }

    def resolve(name):
        if name not in table:
            raise socket.gaierror(f"[Errno -2] Name or service not known: {name}")
        return table[name]

    monkeypatch.setattr(hosts, "_resolve", resolve)
    return table


def test_a_name_becomes_one_literal_address(names):
    assert hosts.literal_address("10.1.2.3") == "10.1.2.3"
    assert hosts.literal_address("[::1]") == "::1"
    for wildcard in ("0.0.0.0", "::", ""):
        assert hosts.literal_address(wildcard) == wildcard  # bound, never advertised
    # Its first IPv4 address, or the one a server is bound to when it is among them.
    assert hosts.literal_address("localhost") == "127.0.0.1"
    assert hosts.literal_address("localhost", prefer="::1") == "::1"
    assert hosts.literal_address("node7.example", prefer="10.0.0.8") == "10.0.0.8"
    assert hosts.literal_address("node7.example", prefer="10.9.9.9") == "10.0.0.7"
    assert hosts.literal_address("v6only.example") == "fd00::7"
    with pytest.raises(ConfigError, match=r"spark.driver.host='nowhere.invalid' does not resolve"):
        hosts.literal_address("nowhere.invalid", "spark.driver.host")


def test_local_host_never_answers_a_name(names, resolves_to):
    resolves_to("10.9.9.9")
    assert local_host(environ={"SPARK_LOCAL_IP": "localhost"}) == "127.0.0.1"
    assert local_host({"spark.driver.host": "localhost"}, environ={}) == "127.0.0.1"


def test_the_status_page_binds_one_literal_address(names):
    from spark_receivers.driver.observe.observability import ui_bind_host

    assert ui_bind_host(StreamingConfig(ui_host="localhost"), environ={}) == "127.0.0.1"
    assert ui_bind_host(StreamingConfig(), environ={"SPARK_LOCAL_IP": "localhost"}) == ("127.0.0.1")
    assert ui_bind_host(StreamingConfig(), environ={}) == "0.0.0.0"


def test_the_executor_jvm_is_found_up_the_process_tree(tmp_path):
    """A real tree: a process named ``java`` with an executor's flags, a child between, and
    the Python worker that asks. Every caller (executor id, executor host) reads this walk."""
    java = tmp_path / "java"
    java.symlink_to(Path(sys.executable).resolve())  # exec'd as "java": its comm is java
    worker = (
        "import json; from spark_receivers.rpc import hosts; "
        "from spark_receivers.spark.receiver_task import executor_id; "
        "jvm = hosts.executor_jvm(); "
        "print(json.dumps([jvm and jvm.pid, executor_id(), hosts.spark_executor_host()]))"
    )
    python = sys.executable  # the venv's: "java" itself is the bare interpreter
    daemon = f"import subprocess; subprocess.run([{python!r}, '-c', {worker!r}])"
    jvm = (
        "import os, subprocess; print(os.getpid(), flush=True); "
        f"subprocess.run([{python!r}, '-c', {daemon!r}])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_EXECUTOR")}
    out = subprocess.run(
        [str(java), "-c", jvm, "--executor-id", "7", "--hostname", "10.1.2.3"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout.split("\n")
    assert json.loads(out[1]) == [int(out[0]), "7", "10.1.2.3"]


def test_no_jvm_above_is_none_and_the_driver():
    assert hosts.executor_jvm() is None  # pytest's ancestors: no JVM
    assert hosts.Jvm(1, ("java", "--executor-id")).flag("--executor-id") is None
