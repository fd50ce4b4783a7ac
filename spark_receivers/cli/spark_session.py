"""The Spark session the commands run on: ``--master``, ``--conf``, ``--deploy-mode``, UI.

Settings are parsed and checked without Spark (:func:`spark_settings`); only
:func:`start_spark` starts a JVM. Nothing is forced: the master comes from
``--master``, else ``--conf spark.master``, else ``spark-defaults.conf``
(``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``), else ``local[4]``; the Spark UI
and our status page (``spark.receivers.ui.*``) are on unless ``--no-ui``;
``SPARK_LOCAL_IP`` is left as the environment has it. On a local master the Python
workers are forked by our worker daemon (``spark.python.daemon.module``,
``spark/worker_daemon.py``) unless ``--conf`` names another.

``--remote sc://HOST:PORT`` joins a Spark Connect server instead (no JVM here): the
server's own settings give the master and Spark's static keys; the ``--conf`` entries are
sent as the session's conf (those the server cannot change at run time are ignored by
pyspark's Connect client).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_receivers.errors import ConfigError
from spark_receivers.spark.cluster import is_local_master

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_MASTER",
    "SparkSettings",
    "is_local",
    "parse_conf",
    "spark_settings",
    "without_unavailable_status_page",
]

DEFAULT_MASTER = "local[4]"
WORKER_DAEMON = "spark_receivers.spark.worker_daemon"
"""``spark.python.daemon.module`` of the sessions the commands start on a local master."""


@dataclass(frozen=True)
class SparkSettings:
    """What the session is built with (no secrets printed from it)."""

    app_name: str
    master: str
    conf: tuple[tuple[str, str], ...]
    """Every ``--conf``, then the defaults the command adds (each only if not given)."""
    remote: str = ""
    """The Spark Connect URL (``sc://HOST:PORT``) of ``--remote``; '' for a classic session."""

    @property
    def conf_dict(self) -> dict[str, str]:
        """``conf`` as a dict."""
        return dict(self.conf)


def parse_conf(items: list[str]) -> dict[str, str]:
    """``--conf KEY=VALUE`` items as a dict; ConfigError for a malformed or repeated one."""
    conf: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            msg = f"--conf must be KEY=VALUE, got {item!r}"
            raise ConfigError(msg)
        if key in conf and conf[key] != value:
            msg = f"--conf {key} is given twice with different values"
            raise ConfigError(msg)
        conf[key] = value
    return conf


def is_local(master: str) -> bool:
    """True for masters whose executors run on this machine (``local*``)."""
    return is_local_master(master) or master.startswith("local-cluster[")


def spark_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The entries of ``spark-defaults.conf`` (empty when there is none)."""
    conf_dir = environ.get("SPARK_CONF_DIR") or (
        os.path.join(environ["SPARK_HOME"], "conf") if environ.get("SPARK_HOME") else None
    )
    path = os.path.join(conf_dir, "spark-defaults.conf") if conf_dir else None
    if path is None or not os.path.isfile(path):
        return {}
    entries = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.replace("=", " ", 1).partition(" ")
                entries[key.strip()] = value.strip()
    return entries


def spark_settings(
    app_name: str,
    master: str | None,
    conf_items: list[str],
    *,
    ui: bool = True,
    deploy_mode: str = "client",
    environ: Mapping[str, str] | None = None,
    remote: str | None = None,
) -> SparkSettings:
    """Check the Spark flags and resolve the master (see the module doc); no Spark."""
    env = os.environ if environ is None else environ
    conf = parse_conf(conf_items)
    if remote is not None:
        return _remote_settings(app_name, remote, master, conf, ui)
    if deploy_mode != "client":
        msg = (
            f"--deploy-mode {deploy_mode} is not supported: this command is the driver "
            "(client mode); for cluster mode, spark-submit a script of your own that "
            "builds the StreamingContext"
        )
        raise ConfigError(msg)
    if conf.get("spark.submit.deployMode", "client") != "client":
        msg = "--conf spark.submit.deployMode must be client: this command is the driver"
        raise ConfigError(msg)
    if master is not None and conf.get("spark.master", master) != master:
        msg = f"--master {master} and --conf spark.master={conf['spark.master']} disagree"
        raise ConfigError(msg)
    master = (
        master or conf.get("spark.master") or spark_defaults(env).get("spark.master")
    ) or DEFAULT_MASTER
    if not master.strip():
        msg = "--master must not be empty"
        raise ConfigError(msg)
    defaults = {
        "spark.app.name": app_name,
        "spark.submit.deployMode": "client",
        "spark.ui.enabled": "true" if ui else "false",
        # Our status page (and /metrics) too: docs/decisions/0006.
        "spark.receivers.ui.enabled": "true" if ui else "false",
        # Spark's progress bars would cut through the per-batch lines.
        "spark.ui.showConsoleProgress": "false",
    }
    for key in ("spark.ui.enabled", "spark.receivers.ui.enabled"):
        if not ui and conf.get(key, "false") != "false":
            msg = f"--no-ui and --conf {key}=true disagree"
            raise ConfigError(msg)
    if is_local(master):
        defaults["spark.sql.shuffle.partitions"] = "4"
        # Python workers forked with our task modules already imported (a local master's
        # workers run this interpreter, which has them): spark/worker_daemon.py.
        defaults["spark.python.daemon.module"] = WORKER_DAEMON
    merged = {**conf, "spark.master": master}
    for key, value in defaults.items():
        merged.setdefault(key, value)
    if not ui:
        merged["spark.ui.enabled"] = merged["spark.receivers.ui.enabled"] = "false"
    return SparkSettings(app_name, master, tuple(merged.items()))


def _remote_settings(
    app_name: str, remote: str, master: str | None, conf: dict[str, str], ui: bool
) -> SparkSettings:
    """The settings of ``--remote``: the URL, and ``--conf`` sent as the session's conf."""
    if not remote.startswith("sc://") or len(remote) <= len("sc://"):
        msg = f"--remote must be a Spark Connect URL sc://HOST:PORT, got {remote!r}"
        raise ConfigError(msg)
    if (master is not None and master != DEFAULT_MASTER) or "spark.master" in conf:
        msg = (
            "--remote and --master (or --conf spark.master) disagree: the Spark Connect "
            "server's master is set where the server starts (start-connect-server.sh --master)"
        )
        raise ConfigError(msg)
    if not ui and conf.get("spark.receivers.ui.enabled", "false") != "false":
        msg = "--no-ui and --conf spark.receivers.ui.enabled=true disagree"
        raise ConfigError(msg)
    merged = {"spark.receivers.ui.enabled": "true" if ui else "false", **conf}
    return SparkSettings(app_name, remote, tuple(merged.items()), remote=remote)


def without_unavailable_status_page(settings: SparkSettings) -> tuple[SparkSettings, str]:
    """The settings with the status page off when aiohttp cannot be imported, and why.

    aiohttp is a dependency of the package, so this only happens in a broken or
    hand-made environment: the command then runs without the page (and /metrics)
    instead of failing at start. Returns ``(settings, "")`` when nothing changes.
    """
    from spark_receivers.errors import MissingDependencyError
    from spark_receivers.util.extras import AIOHTTP, require

    if settings.conf_dict.get("spark.receivers.ui.enabled", "false") != "true":
        return settings, ""
    try:
        require(AIOHTTP, "the status page")
    except MissingDependencyError as e:
        conf = {**settings.conf_dict, "spark.receivers.ui.enabled": "false"}
        return dataclasses.replace(settings, conf=tuple(conf.items())), f"{e}; running without it"
    return settings, ""


def start_spark(settings: SparkSettings, log_level: str = "ERROR") -> SparkSession:
    """Start (or join) the session; the one place a command starts a JVM.

    With ``--remote`` no JVM starts here: a Spark Connect client session joins the server.
    """
    if settings.remote:
        from pyspark.sql import SparkSession as Session

        remote = Session.builder.remote(settings.remote)
        for key, value in settings.conf:
            remote = remote.config(key, value)
        return remote.getOrCreate()
    if is_local(settings.master) and "spark.pyspark.python" not in settings.conf_dict:
        # Local Python workers run this interpreter (on a cluster, the executors' own).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in settings.conf:
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
