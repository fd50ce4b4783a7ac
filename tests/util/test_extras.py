"""Optional libraries: a receiver started without its library names the extra to install."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from spark_receivers import (
    HttpReceiver,
    MissingDependencyError,
    MqttReceiver,
    Receiver,
    ReceiverError,
    RedisStreamReceiver,
)
from spark_receivers.rpc import messages as m
from spark_receivers.testing import StandInTracker, supervise
from spark_receivers.util.extras import AIOHTTP, PAHO_MQTT, REDIS, Requirement, require

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
MISSING = Requirement("spark_receivers_test_no_such_module", "no-such-lib", "nosuch")


def test_a_missing_module_is_an_import_error_naming_the_extra():
    with pytest.raises(MissingDependencyError) as info:
        require(MISSING, "FancyReceiver")
    error = info.value
    assert isinstance(error, ImportError) and error.name == MISSING.module
    assert isinstance(error.__cause__, ModuleNotFoundError)
    text = str(error)
    assert text.startswith("FancyReceiver needs the no-such-lib package, which is not installed")
    assert "pip install 'spark-receivers[nosuch]'" in text
    assert sys.executable in text


@pytest.mark.parametrize(
    ("receiver", "module", "extra"),
    [
        (HttpReceiver(port=0), "aiohttp", "http"),
        (RedisStreamReceiver("redis://127.0.0.1:6379/0", "s"), "redis", "redis"),
        (MqttReceiver("127.0.0.1", 1883, "t"), "paho.mqtt.client", "mqtt"),
    ],
)
def test_each_builtin_receiver_started_without_its_library_says_which_extra(
    receiver, module, extra, monkeypatch
):
    receiver._import_requirements()  # installed here: nothing to say
    monkeypatch.setitem(sys.modules, module, None)  # what Python does for a missing module
    with pytest.raises(MissingDependencyError, match=rf"pip install 'spark-receivers\[{extra}\]'"):
        receiver._import_requirements()


def test_the_extras_in_pyproject_install_what_the_receivers_import():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project["optional-dependencies"]
    hard = " ".join(project["dependencies"])
    for requirement in (REDIS, PAHO_MQTT):
        assert any(d.startswith(requirement.distribution) for d in extras[requirement.extra])
        assert requirement.distribution not in hard  # optional, not a hard dependency
        assert requirement.extra in extras["all"][0]
    # aiohttp serves the driver's status page too: a core dependency since issue 21
    # (docs/decisions/0006); its extra stays, installing nothing more, for old install lines.
    assert AIOHTTP.distribution in hard and extras[AIOHTTP.extra] == []
    assert "spark-receivers[all,connect]" in extras["dev"]  # make / CI test every receiver


class NeedsMissing(Receiver):
    requires = (MISSING,)
    started = False

    def on_start(self) -> None:
        type(self).started = True

    def on_stop(self) -> None:
        pass


def test_the_supervisor_stops_the_receiver_with_the_hint_before_on_start():
    tracker = StandInTracker()
    try:
        sup = supervise(tracker, NeedsMissing())
        sup.start()
        tracker.wait_for(lambda: tracker.of(m.DeregisterReceiver))
        (deregister,) = tracker.of(m.DeregisterReceiver)
        assert deregister.message == "Error starting receiver"
        assert "MissingDependencyError: NeedsMissing needs the no-such-lib package" in (
            deregister.error
        )
        assert "pip install 'spark-receivers[nosuch]'" in deregister.error
        assert not NeedsMissing.started
        with pytest.raises(ReceiverError, match="Error starting receiver") as info:
            sup.await_termination(15)  # the task ends with the error
        assert isinstance(info.value.__cause__, MissingDependencyError)
    finally:
        tracker.close()
