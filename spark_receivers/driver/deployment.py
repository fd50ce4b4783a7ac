"""Before the first receiver runs: the driver's network, the memory budget, and the executors.

:func:`prepare` runs in ``StreamingContext.start()``, before anything starts, and
either returns what the context runs with or raises one
:class:`~spark_receivers.errors.ConfigError` that names the setting to change:

1. the driver endpoint's bind address, advertised host and port range
   (:func:`spark_receivers.rpc.hosts.driver_network`), checked here: the bind
   address must be one of this machine's, the TLS files must be readable;
2. ``spark.receivers.receiver.blockStoreMemory`` when unset (0) becomes
   :func:`derived_block_store_memory` of the executors' memory settings;
3. on a cluster (any master but ``local[N]``), the executors are probed
   (:mod:`spark_receivers.spark.executor_probe`): an executor that cannot import
   ``spark_receivers``, or imports another version, gets this driver's package
   shipped with ``SparkContext.addPyFile`` (``spark.receivers.shipPackage=auto``,
   the default) and is probed again; missing libraries (pyarrow, pandas), TLS
   files it cannot read, a bind address it cannot bind or a driver it cannot
   reach fail here, saying what to pass — never a ``ModuleNotFoundError`` deep in
   a task log while the stream processes nothing.

On Spark Connect (:mod:`spark_receivers.spark.session_kind`) the same steps run through
DataFrame jobs: the probe's tasks land wherever Connect puts them (no preferred
locations), and the package is shipped with ``addArtifacts(pyfile=True)``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import re
import socket
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_receivers.config import LOCAL_BLOCK_STORE_MEMORY, StreamingConfig
from spark_receivers.config_checks import parse_size
from spark_receivers.errors import ConfigError
from spark_receivers.rpc.hosts import EndpointNetwork, check_bindable, driver_network
from spark_receivers.spark import executor_probe
from spark_receivers.spark.cluster import is_local_master
from spark_receivers.spark.session_kind import SparkSide, spark_side

log = logging.getLogger(__name__)

__all__ = [
    "LOCAL_BLOCK_STORE_MEMORY",
    "Deployment",
    "derived_block_store_memory",
    "package_zip",
    "prepare",
]

MIN_BLOCK_STORE_MEMORY = 32 * 1024 * 1024
DOCS = "docs/deploy.md"

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
"""This driver's ``spark_receivers`` directory (inside a zip with ``--py-files``)."""

_shipped: dict[str, str] = {}
_ship_lock = threading.Lock()


@dataclass(frozen=True)
class Deployment:
    """What :func:`prepare` settled: the config to run with and the driver's network."""

    config: StreamingConfig
    driver: EndpointNetwork
    shipped: str | None = None
    """The zip shipped with ``addPyFile`` (None when executors had the package)."""
    side: SparkSide | None = None
    """The session's side (classic or Spark Connect) the context runs its jobs through."""


def package_version() -> str:
    """The ``__version__`` of this package, read as the probe reads it on executors."""
    spec = importlib.util.find_spec("spark_receivers")  # imported already: no import here
    loader, origin = getattr(spec, "loader", None), getattr(spec, "origin", None)
    if loader is None or origin is None or not hasattr(loader, "get_data"):
        return "unknown"
    text = loader.get_data(origin).decode("utf-8", "replace")
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return found.group(1) if found else "unknown"


def derived_block_store_memory(conf: dict[str, str]) -> int:
    """Half the memory an executor gives its Python workers, at least 32 MiB.

    Blocks live in the receiver task's Python worker, which Spark counts against
    ``spark.executor.pyspark.memory`` when set, else against the executor's
    overhead (``spark.executor.memoryOverhead``, default
    ``max(384m, spark.executor.memoryOverheadFactor (0.10) * spark.executor.memory)``).
    Half of it leaves room for the worker itself and for read tasks; blocks past
    the budget spill to the executor's local disk (``MEMORY_AND_DISK``).
    """
    if conf.get("spark.executor.pyspark.memory"):
        python = _size(conf, "spark.executor.pyspark.memory", default_unit="m")
    elif conf.get("spark.executor.memoryOverhead"):
        python = _size(conf, "spark.executor.memoryOverhead", default_unit="m")
    else:
        heap = _size(conf, "spark.executor.memory", default_unit="m", default="1g")
        factor_raw = conf.get("spark.executor.memoryOverheadFactor", "0.10")
        try:
            factor = float(factor_raw)
        except ValueError:
            msg = f"spark.executor.memoryOverheadFactor must be a number, got {factor_raw!r}"
            raise ConfigError(msg) from None
        python = max(384 * 1024 * 1024, int(heap * factor))
    return max(MIN_BLOCK_STORE_MEMORY, python // 2)


def _size(conf: dict[str, str], key: str, default_unit: str, default: str = "0") -> int:
    raw = conf.get(key, default).strip()
    return parse_size(raw + default_unit if raw.isdigit() else raw, key)


def prepare(
    spark: Any, config: StreamingConfig, conf: dict[str, str], structured: bool = True
) -> Deployment:
    """Settle the network, the memory budget and the executors (see the module doc).

    ``spark``: the SparkSession (classic or Spark Connect), its SparkContext or its side;
    ``structured``: the graph has structured streams (read through a Python data source
    that the driver plans).
    """
    side = spark_side(spark)
    network = driver_network(config, conf)
    check_bindable(
        network.bind_host,
        "spark.receivers.driver.bindAddress"
        if config.driver_bind_address
        else "spark.driver.bindAddress (or spark.driver.host)",
    )
    _check_tls_files(config, "the driver")
    if structured:
        _check_driver_python(side.python_exec)
    master = side.master
    if config.block_store_memory_bytes == 0:
        budget = (
            LOCAL_BLOCK_STORE_MEMORY
            if is_local_master(master)
            else derived_block_store_memory(conf)
        )
        config = config.replace(block_store_memory_bytes=budget)
        log.info("block store memory per receiver: %d MiB", budget >> 20)
    shipped = None
    if not is_local_master(master) and config.ship_package != "off":
        shipped = _prepare_executors(side, config, network)
    return Deployment(config, network, shipped, side)


def _tls_files(config: StreamingConfig) -> dict[str, str]:
    if not config.rpc_tls_enabled:
        return {}
    return {
        StreamingConfig.spark_key(name): getattr(config, name)
        for name in ("rpc_tls_cert_file", "rpc_tls_key_file", "rpc_tls_ca_file")
    }


def _check_tls_files(config: StreamingConfig, where: str) -> None:
    for key, path in _tls_files(config).items():
        if not os.access(path, os.R_OK):
            msg = f"{key}={path!r} cannot be read on {where}: give a PEM file that exists there"
            raise ConfigError(msg)


def _check_driver_python(python: str) -> None:
    """Refuse a relative ``spark.pyspark.python`` that does not exist where the driver runs.

    A structured stream is read through a Python data source, which Spark plans in a
    Python worker the driver starts with that same path (relative to the driver's
    working directory): ``./env/bin/python`` of ``--archives env.tar.gz#env`` exists on
    the executors only, and every trigger would fail. (Receiver streams' batches are read
    by ``mapInArrow`` tasks on the executors: the driver starts no Python worker for them.)
    """
    if not python or os.path.isabs(python) or os.sep not in python or os.path.exists(python):
        return
    msg = (
        f"spark.pyspark.python={python!r} does not exist in the driver's working directory "
        f"({os.getcwd()}): Spark plans Python data sources (how structured streams are "
        "read) in a Python worker the driver starts with that path. In client mode unpack "
        "the same archive there too (mkdir -p env && tar -xzf env.tar.gz -C env), or give a "
        f"path that exists on the driver and every executor (see {DOCS})"
    )
    raise ConfigError(msg)


# --- the executors ------------------------------------------------------------------


def _prepare_executors(
    side: SparkSide, config: StreamingConfig, network: EndpointNetwork
) -> str | None:
    from spark_receivers.driver.tracking.receiver_launcher import (
        alive_executors,
        wait_for_executors,
    )

    wait_for_executors(side)
    executors = [loc for loc in alive_executors(side) if loc.executor_id != "driver"]
    if not executors:
        return None
    reports = _probe(side, config, network, executors)
    want = package_version()
    stale = [r for r in reports if r["package_origin"] is None or r["package_version"] != want]
    shipped = None
    if stale:
        if config.ship_package != "auto":
            raise ConfigError(_package_message(stale, want, shipped=False))
        shipped = _ship(side)
        reports = _probe(side, config, network, executors)
        stale = [r for r in reports if r["package_version"] != want]
        if stale:
            raise ConfigError(_package_message(stale, want, shipped=True))
    _check_reports(reports, config)
    return shipped


def _probe(
    side: SparkSide,
    config: StreamingConfig,
    network: EndpointNetwork,
    executors: list[Any],
) -> list[dict[str, Any]]:
    """One probe task per executor, each preferring its executor; the reports."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(executor_probe)
    with _listener(network) as listener:
        settings = {
            "tls_files": _tls_files(config),
            "bind_host": config.executor_bind_address or config.executor_host,
            "ports": list(_parse_ports(config.executor_ports)),
            "driver": [network.advertise_host, listener.getsockname()[1]],
        }
        accept = threading.Thread(target=_accept_all, args=(listener,), daemon=True)
        accept.start()
        items = [(i, [loc]) for i, loc in enumerate(executors)]
        func = functools.partial(executor_probe.probe, settings)
        try:
            reports, _ = side.run_located(items, func, strict=False)
        except Exception as e:
            msg = (
                f"the executors could not run the start-up probe of spark-receivers: "
                f"{_first_line(e)}; check that their Python (spark.pyspark.python or "
                f"PYSPARK_PYTHON) has the driver's Python version, pyarrow and pandas "
                f"(see {DOCS})"
            )
            raise ConfigError(msg) from e
    seen: dict[str, dict[str, Any]] = {}
    for report in reports:
        seen.setdefault(str(report["executor_id"]), report)
    log.info("executor probe: %s", list(seen.values()))
    return list(seen.values())


def _listener(network: EndpointNetwork) -> socket.socket:
    """A TCP listener on the driver's bind address, in its port range when it can."""
    for port in range(network.ports[0], network.ports[1] + 1):
        try:
            return socket.create_server((network.bind_host, port))
        except OSError:
            continue
    return socket.create_server((network.bind_host, 0))


def _parse_ports(raw: str) -> tuple[int, int]:
    from spark_receivers.config_checks import parse_ports

    return parse_ports(raw, "spark.receivers.executor.ports")


def _accept_all(listener: socket.socket) -> None:
    """Accept the probe's connections until the listener closes."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.close()


def _first_line(error: BaseException) -> str:
    from spark_receivers.driver.tracking.receiver_launcher import summarize_failure

    return summarize_failure(error)


def _where(report: dict[str, Any]) -> str:
    return f"executor {report['executor_id']} ({report['host']}, Python {report['python']})"


def _package_message(stale: list[dict[str, Any]], want: str, shipped: bool) -> str:
    report = stale[0]
    found = (
        "cannot import spark_receivers"
        if report["package_origin"] is None
        else f"imports spark_receivers {report['package_version']} from {report['package_origin']}"
    )
    tried = " even after it was shipped with addPyFile" if shipped else ""
    site = PACKAGE_ROOT.parent
    return (
        f"{_where(report)} {found}{tried}, but this driver runs spark_receivers {want}: pass "
        f"--py-files with a zip of the package (cd {site} && zip -qr /tmp/spark_receivers.zip "
        "spark_receivers), or --archives env.tar.gz#env --conf "
        "spark.pyspark.python=./env/bin/python with a venv-pack'ed environment that has "
        f"spark-receivers {want}, or set spark.receivers.shipPackage=auto to ship it "
        f"(a wheel in --py-files is not put on sys.path; see {DOCS})"
    )


def _check_reports(reports: list[dict[str, Any]], config: StreamingConfig) -> None:
    for report in reports:
        if report["missing"]:
            msg = (
                f"{_where(report)} cannot import {', '.join(report['missing'])}: ship an "
                "environment that has them (--archives env.tar.gz#env --conf "
                "spark.pyspark.python=./env/bin/python, made with venv-pack), or install "
                f"them on every node (see {DOCS})"
            )
            raise ConfigError(msg)
        for key, path in report["unreadable"].items():
            msg = (
                f"{key}={path!r} cannot be read on {_where(report)}: put the file at that "
                f"path on every node, or ship it with --files and give its bare name ({DOCS})"
            )
            raise ConfigError(msg)
        if report["bind_error"]:
            key = (
                "spark.receivers.executor.bindAddress"
                if config.executor_bind_address
                else "spark.receivers.executor.host"
                if config.executor_host
                else "spark.receivers.executor.ports"
            )
            msg = f"{key}: block servers cannot bind on {_where(report)}: {report['bind_error']}"
            raise ConfigError(msg)
        if report["driver_error"]:
            msg = (
                f"{_where(report)} cannot reach the driver at {report['driver_error']}: open "
                "the driver's port range (spark.receivers.driver.ports) from the executors, "
                "or set spark.receivers.driver.host to an address they reach the driver by "
                f"(see {DOCS})"
            )
            raise ConfigError(msg)


def package_zip(directory: str | None = None) -> str:
    """Write a zip of this driver's ``spark_receivers`` package; return its path.

    The name carries a hash of the contents, so a changed package is a new file
    for ``addPyFile`` (Spark refuses the same name with other contents).
    """
    archive = _enclosing_zip(PACKAGE_ROOT)
    if archive is not None:
        return str(archive)  # the driver runs the package from a zip (--py-files): ship it
    root = PACKAGE_ROOT
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    out_dir = directory or tempfile.mkdtemp(prefix="spark-receivers-ship-")
    version = re.sub(r"[^\w.]", "_", package_version())
    out = os.path.join(out_dir, f"spark_receivers-{version}-{digest.hexdigest()[:12]}.zip")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in files:
            z.write(path, f"spark_receivers/{path.relative_to(root)}")
    return out


def _enclosing_zip(path: Path) -> Path | None:
    """The zip file ``path`` lies in, when it is inside one."""
    for parent in path.parents:
        if parent.is_file():
            return parent if zipfile.is_zipfile(parent) else None
    return None


def _ship(side: SparkSide) -> str:
    """``addPyFile`` a zip of this package, once per application."""
    app = side.app_id
    with _ship_lock:
        if app in _shipped:
            return _shipped[app]
        path = package_zip()
        side.add_py_file(path)
        _shipped[app] = path
    log.warning(
        "executors lack spark_receivers %s: shipped %s with addPyFile",
        package_version(),
        os.path.basename(path),
    )
    return path
