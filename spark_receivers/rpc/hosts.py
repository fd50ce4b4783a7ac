"""The one place that decides which host our servers bind to and which they advertise.

Two kinds of servers, each with a bind address, an advertised host and a port range
(keys under ``spark.receivers.*``, see docs/deploy.md):

* the driver's tracker endpoint (:func:`driver_network`): advertised as
  ``spark.receivers.driver.host``, else Spark's own ``spark.driver.host`` (what
  executors already reach the driver by); bound to
  ``spark.receivers.driver.bindAddress``, else ``spark.driver.bindAddress``, else
  the advertised host;
* a receiver's block server on an executor (:func:`executor_network`): advertised
  as ``spark.receivers.executor.host``, else **the host Spark knows the executor
  by** (the ``--hostname`` its cluster manager started it with), never what this
  machine's hostname resolves to (``127.0.1.1`` on stock Debian/Ubuntu); bound to
  ``spark.receivers.executor.bindAddress``, else the advertised host.

A wildcard (``0.0.0.0``) may be bound, never advertised: resolving to one raises
:class:`~spark_receivers.errors.ConfigError` naming the key it came from.

**One literal address per server.** A name may resolve to several addresses
(``localhost``: ``127.0.0.1`` and ``::1``). A server bound to such a name binds
what it can and says nothing of the address another server holds on the same port,
and its clients, resolving the name again, may reach that other server (a
structured stream's offsets request once reached a receiver's endpoint so). So every
server binds and advertises one literal address, :func:`literal_address`: names are
resolved once, here, never by gRPC or the clients.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spark_receivers.config_checks import WILDCARDS, parse_ports
from spark_receivers.errors import ConfigError

__all__ = [
    "DRIVER_HOST_KEYS",
    "FALLBACK_HOST",
    "WILDCARD_HOSTS",
    "EndpointNetwork",
    "Jvm",
    "check_bindable",
    "driver_network",
    "executor_jvm",
    "executor_network",
    "literal_address",
    "local_host",
    "spark_executor_host",
]

FALLBACK_HOST = "127.0.0.1"
"""Used when this machine's hostname does not resolve."""

DRIVER_HOST_KEYS = ("spark.driver.bindAddress", "spark.driver.host")
"""The driver's Spark conf keys :func:`local_host` consults, in order."""

WILDCARD_HOSTS = (*WILDCARDS, "")
"""Hosts no client can connect to."""


@dataclass(frozen=True)
class EndpointNetwork:
    """Where one server binds, what it advertises, and which ports it may take."""

    bind_host: str
    advertise_host: str
    ports: tuple[int, int] = (0, 0)

    def endpoint_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~spark_receivers.rpc.transport.FlightEndpoint`."""
        return {"advertise_host": self.advertise_host, "ports": self.ports}


def literal_address(host: str, key: str = "host", prefer: str | None = None) -> str:
    """One literal IP address for ``host``: itself if it is one, else what it resolves to.

    A name resolving to several addresses gives ``prefer`` when it is one of them (the
    bound address, for the one a server advertises), else its first IPv4 address (as
    the JVM prefers), else its first. Wildcards (``0.0.0.0``, ``::``, ``''``) are kept:
    they may be bound, never advertised. Names are resolved once per process. Raises
    :class:`ConfigError` naming ``key`` when ``host`` does not resolve.
    """
    if host in WILDCARD_HOSTS:
        return host
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    try:
        addresses = _resolve(bare)
    except OSError as e:
        msg = f"{key}={host!r} does not resolve here: {e}"
        raise ConfigError(msg) from None
    if prefer is not None and prefer in addresses:
        return prefer
    return next((a for a in addresses if ":" not in a), addresses[0])


@functools.lru_cache(maxsize=64)
def _resolve(name: str) -> tuple[str, ...]:
    """Every address ``name`` resolves to, in the resolver's order (at least one)."""
    infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    found = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    if not found:
        msg = f"no address for {name!r}"
        raise socket.gaierror(msg)
    return found


def local_host(
    spark_conf: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """The address of servers that have no setting of their own (listening receivers).

    1. ``SPARK_LOCAL_IP`` when set (it is what Spark itself binds to);
    2. on the driver (``spark_conf`` given): ``spark.driver.bindAddress``, then
       ``spark.driver.host``;
    3. this machine's hostname, resolved (``socket.gethostbyname``);
    4. ``127.0.0.1`` when the hostname does not resolve.

    Always one literal address (:func:`literal_address`): ``localhost`` in 1 or 2
    gives ``127.0.0.1``.

    ``environ`` replaces ``os.environ`` (tests). May block on a DNS lookup;
    call it once at startup, not per message.
    """
    env = os.environ if environ is None else environ
    ip = env.get("SPARK_LOCAL_IP")
    if ip:
        return literal_address(ip, "SPARK_LOCAL_IP")
    if spark_conf:
        for key in DRIVER_HOST_KEYS:
            value = spark_conf.get(key)
            if value:
                return literal_address(value, key)
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return FALLBACK_HOST


def driver_network(cfg: Any, spark_conf: Mapping[str, str]) -> EndpointNetwork:
    """The tracker endpoint's network settings (see the module doc); no I/O.

    ``cfg`` is a :class:`~spark_receivers.config.StreamingConfig`.
    """
    if cfg.driver_host:
        host, key = cfg.driver_host, "spark.receivers.driver.host"
    elif spark_conf.get("spark.driver.host"):
        host, key = spark_conf["spark.driver.host"], "spark.driver.host"
    else:
        host, key = local_host(spark_conf), "spark.driver.bindAddress / SPARK_LOCAL_IP"
    if host in WILDCARD_HOSTS:
        msg = (
            f"{key}={host!r} cannot be advertised to executors: set "
            "spark.receivers.driver.host to the host name or address executors reach the "
            "driver by"
        )
        raise ConfigError(msg)
    bind = cfg.driver_bind_address or spark_conf.get("spark.driver.bindAddress") or host
    ports = parse_ports(cfg.driver_ports, "spark.receivers.driver.ports")
    return EndpointNetwork(bind, host, ports)


def spark_executor_host(pid: int | None = None) -> str | None:
    """The host Spark knows this executor by, or None outside an executor.

    A Python worker is a child of its executor's JVM (through PySpark's daemon),
    whose command line carries ``--hostname`` (standalone, YARN and Kubernetes
    executors all get one from their cluster manager); Kubernetes also sets
    ``SPARK_EXECUTOR_POD_IP``.
    """
    pod_ip = os.environ.get("SPARK_EXECUTOR_POD_IP")
    if pod_ip:
        return pod_ip
    jvm = executor_jvm(pid)
    if jvm is None or "--executor-id" not in jvm.args:
        return None
    return jvm.flag("--hostname")


@dataclass(frozen=True)
class Jvm:
    """A JVM process: its pid and command line."""

    pid: int
    args: tuple[str, ...]

    def flag(self, name: str) -> str | None:
        """The value after ``name`` on the command line (``--executor-id 3``), or None."""
        if name not in self.args:
            return None
        at = self.args.index(name) + 1
        return self.args[at] if at < len(self.args) else None


def executor_jvm(pid: int | None = None) -> Jvm | None:
    """The JVM this Python process serves, found by walking up ``/proc``; None if none.

    A Python worker is a child of PySpark's daemon, a child of the executor's JVM (the
    driver's JVM in local mode): the walk goes from ``pid`` (this process) up to the first
    process named ``java`` or carrying ``--executor-id``, at most 8 steps. The one walk of
    the package; the executor probe, shipped by value to executors that may lack the
    package, keeps a marked copy (``spark/executor_probe.py``).
    """
    pid = os.getpid() if pid is None else pid
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            if comm == "java" or "--executor-id" in args:
                return Jvm(pid, args)
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def _route_to(host: str) -> str | None:
    """The local address this machine reaches ``host`` from (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            address = str(s.getsockname()[0])
    except OSError:
        return None
    return None if address in WILDCARD_HOSTS else address


def executor_network(cfg: Any, driver_host: str) -> EndpointNetwork:
    """A block server's network settings on this executor (see the module doc).

    ``driver_host`` is the host of the driver's endpoint: in local mode (no
    executor JVM above us) the block server is on the driver's machine and
    advertises that host; failing everything else, the address this machine
    routes to the driver from.
    """
    host = cfg.executor_host or spark_executor_host()
    driver_host = driver_host.removeprefix("[").removesuffix("]")  # from an IPv6 host:port
    if not host:
        host = driver_host if driver_host not in WILDCARD_HOSTS else None
        if host is None or not _is_local_address(host):
            host = _route_to(driver_host) or local_host()
    bind = cfg.executor_bind_address or host
    ports = parse_ports(cfg.executor_ports, "spark.receivers.executor.ports")
    return EndpointNetwork(bind, host, ports)


def _is_local_address(host: str) -> bool:
    """True when ``host`` names an address of this machine (it can be bound here)."""
    try:
        check_bindable(host, "host")
    except ConfigError:
        return False
    return True


def check_bindable(host: str, key: str) -> None:
    """Raise :class:`ConfigError` naming ``key`` unless ``host`` can be bound on this machine."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError as e:
        msg = f"{key}={host!r} does not resolve here: {e}"
        raise ConfigError(msg) from None
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind(address)
        except OSError as e:
            error = e
        else:
            return
    msg = f"{key}={host!r} is not an address of this machine ({error}): nothing can bind it"
    raise ConfigError(msg)
