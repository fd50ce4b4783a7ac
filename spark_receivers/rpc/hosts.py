"""The one place that decides which host our servers bind to and advertise.

Both sides use it: the driver for the receiver tracker's endpoint (it passes its
Spark conf), an executor for a receiver's block server and for built-in
receivers that listen (no conf: executors do not see the driver's keys).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["DRIVER_HOST_KEYS", "FALLBACK_HOST", "local_host"]

FALLBACK_HOST = "127.0.0.1"
"""Used when this machine's hostname does not resolve."""

DRIVER_HOST_KEYS = ("spark.driver.bindAddress", "spark.driver.host")
"""The driver's Spark conf keys consulted, in order."""


def local_host(
    spark_conf: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """The host our servers bind to and advertise, in this order.

    1. ``SPARK_LOCAL_IP`` when set (it is what Spark itself binds to);
    2. on the driver (``spark_conf`` given): ``spark.driver.bindAddress``, then
       ``spark.driver.host``;
    3. this machine's hostname, resolved (``socket.gethostbyname``);
    4. ``127.0.0.1`` when the hostname does not resolve.

    ``environ`` replaces ``os.environ`` (tests). May block on a DNS lookup;
    call it once at startup, not per message.
    """
    env = os.environ if environ is None else environ
    ip = env.get("SPARK_LOCAL_IP")
    if ip:
        return ip
    if spark_conf:
        for key in DRIVER_HOST_KEYS:
            value = spark_conf.get(key)
            if value:
                return value
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return FALLBACK_HOST
