"""The optional libraries of the built-in receivers and the extras that install them.

``pip install spark-receivers`` brings what every receiver needs; a receiver
that talks to a broker needs one more library, installed by an extra:
``spark-receivers[redis]`` (redis), ``[mqtt]`` (paho-mqtt), ``[amqp]`` (pika),
``[nats]`` (nats-py), ``[websocket]`` (websockets), or ``[all]``.
(``[http]`` is kept for old install lines: aiohttp, which the HTTP receiver and
the driver's status page use, is a core dependency now.) Such a receiver lists what it needs in
``requires`` (a :class:`Requirement` per library); it is imported when the
receiver starts, on the executor, and a missing one raises
:class:`~spark_receivers.errors.MissingDependencyError` naming the extra
instead of a bare ``ModuleNotFoundError`` (and the receiver stops instead of
restarting forever).
"""

from __future__ import annotations

import importlib
import socket
import sys
from dataclasses import dataclass
from types import ModuleType

from spark_receivers.errors import MissingDependencyError

__all__ = [
    "AIOHTTP",
    "NATS",
    "PAHO_MQTT",
    "PIKA",
    "REDIS",
    "WEBSOCKETS",
    "Requirement",
    "require",
]


@dataclass(frozen=True)
class Requirement:
    """A module a receiver imports, the distribution that has it and the extra installing it."""

    module: str
    distribution: str
    extra: str

    @property
    def install_hint(self) -> str:
        """``pip install 'spark-receivers[<extra>]'``."""
        return f"pip install 'spark-receivers[{self.extra}]'"


AIOHTTP = Requirement("aiohttp", "aiohttp", "http")
REDIS = Requirement("redis", "redis", "redis")
PAHO_MQTT = Requirement("paho.mqtt.client", "paho-mqtt", "mqtt")
PIKA = Requirement("pika", "pika", "amqp")
NATS = Requirement("nats", "nats-py", "nats")
WEBSOCKETS = Requirement("websockets.sync.client", "websockets", "websocket")


def require(requirement: Requirement, who: str) -> ModuleType:
    """Import ``requirement.module`` or raise :class:`MissingDependencyError` for ``who``.

    The message names the library, where it is missing (host and Python) and
    the ``pip install 'spark-receivers[extra]'`` that fixes it. Any thread.
    """
    try:
        return importlib.import_module(requirement.module)
    except ImportError as e:
        msg = (
            f"{who} needs the {requirement.distribution} package, which is not installed "
            f"in {sys.executable} on {socket.gethostname()}: {requirement.install_hint} "
            "(or [all]) in the Python environment of every executor"
        )
        raise MissingDependencyError(msg, name=requirement.module) from e
