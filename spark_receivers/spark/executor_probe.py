"""What an executor can do, asked by the driver at ``start()`` (runs in an executor's Python).

:func:`probe` is shipped **by value** (the driver registers this module with
cloudpickle): it must run on executors that cannot import ``spark_receivers``,
so it imports only the standard library, inside the function. It reports, as a
JSON-friendly dict:

* the executor (id, the host Spark knows it by) and its Python (path, version);
* whether ``spark_receivers`` is importable there, from where and in which
  version (read from its ``__init__.py``, never imported: a worker that imported
  an old version would keep it), and which required libraries are missing;
* whether the TLS files named by the config can be read there;
* whether the block servers' bind address can be bound there;
* whether the driver's endpoint host and port range can be reached from there
  (a TCP connection to a listener the driver opened for the probe).

The driver turns a bad report into one clear error at ``start()``
(:mod:`spark_receivers.driver.deployment`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["REQUIRED_MODULES", "probe"]

REQUIRED_MODULES = ("pyarrow", "pandas")
"""What a receiver task needs besides spark_receivers and PySpark itself."""


def probe(settings: dict[str, Any], _rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
    """The report of the executor this runs on (see the module doc).

    ``functools.partial(probe, settings)`` is the ``mapPartitions`` function.

    ``settings``: ``tls_files`` ({key: path}), ``bind_host``, ``bind_key``,
    ``ports`` ([first, last]), ``driver`` ([host, port] of the driver's listener).
    """
    import contextlib
    import importlib.util
    import os
    import re
    import socket
    import sys

    def executor_identity() -> tuple[str, str | None]:
        # A copy of spark_receivers.rpc.hosts.executor_jvm's /proc walk, kept because this
        # function is shipped by value to executors that may not have the package.
        pid = os.getpid()
        for _ in range(6):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                if "--executor-id" in args:
                    host = args[args.index("--hostname") + 1] if "--hostname" in args else None
                    return args[args.index("--executor-id") + 1], host
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                break
            if pid <= 1:
                break
        return os.environ.get("SPARK_EXECUTOR_ID", "driver"), os.environ.get(
            "SPARK_EXECUTOR_POD_IP"
        )

    executor_id, spark_host = executor_identity()
    report: dict[str, Any] = {
        "executor_id": executor_id,
        "host": spark_host,
        "python": sys.executable,
        "python_version": ".".join(map(str, sys.version_info[:3])),
    }
    spec = importlib.util.find_spec("spark_receivers")
    report["package_origin"] = spec.origin if spec is not None else None
    report["package_version"] = None
    if spec is not None and spec.loader is not None and spec.origin:
        with contextlib.suppress(Exception):
            text = spec.loader.get_data(spec.origin).decode("utf-8", "replace")  # type: ignore[attr-defined]
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
            report["package_version"] = found.group(1) if found else None
    report["missing"] = [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]
    report["unreadable"] = {
        key: path
        for key, path in settings.get("tls_files", {}).items()
        if not os.access(path, os.R_OK)
    }
    bind_host = settings.get("bind_host") or spark_host or ""
    first, last = settings.get("ports", [0, 0])
    report["bind_error"] = None
    if bind_host:
        error = None
        for port in range(first, last + 1):
            try:
                family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.bind((bind_host, port))
                error = None
                break
            except OSError as e:
                error = f"{bind_host} ports {first}-{last}: {e}"
        report["bind_error"] = error
    report["driver_error"] = None
    driver = settings.get("driver")
    if driver:
        try:
            with socket.create_connection((driver[0], int(driver[1])), timeout=5):
                pass
        except OSError as e:
            report["driver_error"] = f"{driver[0]}:{driver[1]}: {e or type(e).__name__}"
    yield report
