"""Parsing Spark conf strings into config fields, and checking a config's values.

Used by :class:`spark_receivers.config.StreamingConfig` only: ``parse`` turns the
string a Spark conf holds into a field's type; ``validate`` checks every field and
raises :class:`~spark_receivers.errors.ConfigError` naming the field, its Spark
key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from spark_receivers.errors import ConfigError
from spark_receivers.util.durations import parse_duration

MAX_RECORD_BYTES_LIMIT = 64 * 1024 * 1024
"""The most ``max_record_bytes`` may be (64 MiB, the block generator's block size)."""


def check_max_record_bytes(value: object, what: str) -> int:
    """``value`` as a record size limit: an int in 1..MAX_RECORD_BYTES_LIMIT; ConfigError else."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 < value <= (MAX_RECORD_BYTES_LIMIT)
    ):
        msg = (
            f"{what} must be an integer number of bytes in 1..{MAX_RECORD_BYTES_LIMIT:,} "
            f"(64 MiB: a larger row endangers the executor's JVM), got {value!r}"
        )
        raise ConfigError(msg)
    return value


RATE_ESTIMATORS = ("pid",)
"""Names accepted by ``spark.streaming.backpressure.rateEstimator``."""
SHIP_PACKAGE_MODES = ("auto", "check", "off")
"""Values of ``spark.receivers.shipPackage``."""
WILDCARDS = ("0.0.0.0", "::", "[::]")
"""Bind-everything addresses: fine to bind, never to advertise."""
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

LOST_BLOCK_POLICIES = ("fail", "skip")
"""Values accepted by ``spark.receivers.lostBlockPolicy``."""


def parse(f: dataclasses.Field[Any], spark_key: str, raw: str) -> Any:
    """The value of field ``f`` from the Spark conf string ``raw`` (read under ``spark_key``)."""
    default = f.default
    if isinstance(default, str):
        return raw.strip()
    if f.name.endswith("_bytes"):
        return parse_size(raw, spark_key)
    if f.name.endswith("_ms"):
        return round(parse_duration(raw, spark_key, default_unit="ms") * 1000)
    if f.name.endswith("_s"):
        return parse_duration(raw, spark_key, default_unit="s")
    if f.name.endswith("_bytes"):
        return parse_size(raw, spark_key)
    if isinstance(default, bool):
        if raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        msg = f"{spark_key} must be true or false, got {raw!r}"
        raise ConfigError(msg)
    try:
        integral = raw.strip().removeprefix("-").isdigit()
        return int(raw) if isinstance(default, int) and integral else float(raw)
    except ValueError:
        msg = f"{spark_key} must be a number, got {raw!r}"
        raise ConfigError(msg) from None


def parse_size(raw: str, spark_key: str) -> int:
    """Bytes from Spark's size syntax: ``4096``, ``64k``, ``512m``, ``1g`` (``kb``/``mb`` too)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", raw.lower())
    if m is None:
        msg = f"{spark_key} must be a size in bytes (4096, 64k, 512m, 1g), got {raw!r}"
        raise ConfigError(msg)
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def parse_ports(raw: str, spark_key: str) -> tuple[int, int]:
    """``"0"`` (any port), ``"N"`` or ``"N-M"`` as an inclusive ``(first, last)``."""
    m = re.fullmatch(r"\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?", raw)
    first = int(m.group(1)) if m else -1
    last = int(m.group(2) or first) if m else -1
    if m is None or last > 65535 or last < first or (first == 0 and last != 0):
        msg = (
            f"{spark_key} must be 0 (any free port), a port, or a range like 40000-40009; "
            f"got {raw!r}"
        )
        raise ConfigError(msg)
    return first, last


def validate(cfg: Any) -> None:
    """Check every field of a :class:`~spark_receivers.config.StreamingConfig`."""
    for name in (
        "block_interval_ms",
        "block_queue_size",
        "concurrent_jobs",
        "max_message_bytes",
    ):
        _positive_int(cfg, name)
    for name in ("receiver_restart_delay_ms", "graceful_stop_timeout_ms", "batch_read_partitions"):
        _non_negative(cfg, name, integral=True)
    for name in (
        "receiver_max_rate",
        "warm_up_timeout_s",
        "receiver_start_timeout_s",
        "backpressure_initial_rate",
        "backpressure_pid_proportional",
        "backpressure_pid_integral",
        "backpressure_pid_derived",
    ):
        _non_negative(cfg, name)
    for name in (
        "block_store_timeout_s",
        "backpressure_pid_min_rate",
        "receiver_stop_timeout_s",
        "receiver_drain_timeout_s",
        "receiver_restart_window_s",
    ):
        _positive(cfg, name)
    _at_least_minus_one(cfg, "receiver_max_restarts")
    for f in dataclasses.fields(cfg):
        if isinstance(f.default, bool):
            _bool(cfg, f.name)
    check_max_record_bytes(
        cfg.receiver_max_record_bytes, _describe(cfg, "receiver_max_record_bytes")
    )
    if cfg.job_id and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", cfg.job_id):
        msg = (
            f"{_describe(cfg, 'job_id')} must be 1-64 letters, digits, '-', '_' or '.'; "
            f"got {cfg.job_id!r}"
        )
        raise ConfigError(msg)
    if cfg.backpressure_rate_estimator not in RATE_ESTIMATORS:
        msg = (
            f"{_describe(cfg, 'backpressure_rate_estimator')} must be one of "
            f"{', '.join(RATE_ESTIMATORS)}; got {cfg.backpressure_rate_estimator!r}"
        )
        raise ConfigError(msg)
    if cfg.lost_block_policy not in LOST_BLOCK_POLICIES:
        msg = (
            f"{_describe(cfg, 'lost_block_policy')} must be one of "
            f"{', '.join(LOST_BLOCK_POLICIES)}; got {cfg.lost_block_policy!r}"
        )
        raise ConfigError(msg)
    if not isinstance(cfg.checkpoint_dir, str):
        msg = (
            f"{_describe(cfg, 'checkpoint_dir')} must be a path or URI string ('' for none), "
            f"got {cfg.checkpoint_dir!r}"
        )
        raise ConfigError(msg)
    for side in ("receiver", "driver"):
        _positive(cfg, f"{side}_wal_rolling_interval_s")
        _positive_int(cfg, f"{side}_wal_max_failures")
    _positive_int(cfg, "driver_wal_batching_timeout_ms")
    _validate_deployment(cfg)
    _positive_int(cfg, "metrics_report_interval_ms")
    _positive_int(cfg, "ui_retained_batches")
    port = cfg.ui_port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        msg = f"{_describe(cfg, 'ui_port')} must be a port 0-65535 (0: any free one), got {port!r}"
        raise ConfigError(msg)
    if not isinstance(cfg.ui_host, str):
        msg = f"{_describe(cfg, 'ui_host')} must be a host string ('' for the default), got "
        raise ConfigError(msg + repr(cfg.ui_host))


def _validate_deployment(cfg: Any) -> None:
    """The network, TLS and deployment keys (their syntax; what they name is checked at start)."""
    for name in (
        "driver_host",
        "driver_bind_address",
        "driver_ports",
        "executor_host",
        "executor_bind_address",
        "executor_ports",
        "rpc_tls_cert_file",
        "rpc_tls_key_file",
        "rpc_tls_ca_file",
        "rpc_tls_server_name",
        "ship_package",
    ):
        if not isinstance(getattr(cfg, name), str):
            msg = f"{_describe(cfg, name)} must be a string, got {getattr(cfg, name)!r}"
            raise ConfigError(msg)
    for name in ("driver_ports", "executor_ports"):
        parse_ports(getattr(cfg, name), _describe(cfg, name))
    for name in ("driver_host", "executor_host"):
        if getattr(cfg, name).strip() in WILDCARDS:
            msg = (
                f"{_describe(cfg, name)} is advertised to other processes and cannot be "
                f"{getattr(cfg, name)!r}: give a host name or address they reach this one by "
                "(bind every interface with the bindAddress key instead)"
            )
            raise ConfigError(msg)
    if cfg.rpc_tls_client_auth and not cfg.rpc_tls_enabled:
        msg = (
            f"{_describe(cfg, 'rpc_tls_client_auth')} is true but spark.receivers.rpc.tls.enabled "
            "is false: client certificates need TLS; enable it (with certFile, keyFile, caFile) "
            "or leave clientAuth off"
        )
        raise ConfigError(msg)
    if cfg.rpc_tls_enabled:
        for name in ("rpc_tls_cert_file", "rpc_tls_key_file", "rpc_tls_ca_file"):
            if not getattr(cfg, name):
                msg = (
                    f"{_describe(cfg, name)} must name a PEM file when "
                    "spark.receivers.rpc.tls.enabled is true"
                )
                raise ConfigError(msg)
    value = cfg.block_store_memory_bytes
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = (
            f"{_describe(cfg, 'block_store_memory_bytes')} must be a size >= 0 "
            f"(0 = derived), got {value!r}"
        )
        raise ConfigError(msg)
    if cfg.ship_package not in SHIP_PACKAGE_MODES:
        msg = (
            f"{_describe(cfg, 'ship_package')} must be one of {', '.join(SHIP_PACKAGE_MODES)}; "
            f"got {cfg.ship_package!r}"
        )
        raise ConfigError(msg)


def _describe(cfg: Any, name: str) -> str:
    key = next(f.metadata["spark_key"] for f in dataclasses.fields(cfg) if f.name == name)
    return f"{name} ({key})"


def _number(cfg: Any, name: str) -> float:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        msg = f"{_describe(cfg, name)} must be a number, got {value!r}"
        raise ConfigError(msg)
    return float(value)


def _positive_int(cfg: Any, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        msg = f"{_describe(cfg, name)} must be an integer > 0, got {value!r}"
        raise ConfigError(msg)


def _positive(cfg: Any, name: str) -> None:
    if _number(cfg, name) <= 0:
        msg = f"{_describe(cfg, name)} must be > 0, got {getattr(cfg, name)!r}"
        raise ConfigError(msg)


def _non_negative(cfg: Any, name: str, *, integral: bool = False) -> None:
    value = _number(cfg, name)
    if value < 0 or (integral and not isinstance(getattr(cfg, name), int)):
        kind = "an integer >= 0" if integral else ">= 0"
        msg = f"{_describe(cfg, name)} must be {kind}, got {getattr(cfg, name)!r}"
        raise ConfigError(msg)


def _at_least_minus_one(cfg: Any, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        msg = f"{_describe(cfg, name)} must be an integer >= 0, or -1 for no limit, got {value!r}"
        raise ConfigError(msg)


def _bool(cfg: Any, name: str) -> None:
    if not isinstance(getattr(cfg, name), bool):
        msg = f"{_describe(cfg, name)} must be True or False, got {getattr(cfg, name)!r}"
        raise ConfigError(msg)
