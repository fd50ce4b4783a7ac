"""The keys of where and how a context runs: network, TLS, memory, block keepers, metrics, UI.

A base of :class:`~spark_receivers.config.StreamingConfig` (which holds the keys of
what a stream does); every field here is a field of ``StreamingConfig`` and is read,
validated and documented with it. All are keys of our own, under
``spark.receivers.*`` (``spark.streaming.ui.retainedBatches`` is Spark's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LOCAL_BLOCK_STORE_MEMORY", "DeploymentKeys", "key"]

LOCAL_BLOCK_STORE_MEMORY = 512 * 1024 * 1024
"""The block budget when ``block_store_memory_bytes`` is 0 and nothing derived it."""


def key(default: Any, spark_key: str, doc: str, *, old: str | None = None) -> Any:
    """A config field: its default, its Spark conf key, its doc and an old key it replaced."""
    meta = {"spark_key": spark_key, "doc": doc, "old_key": old}
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class DeploymentKeys:
    """Network, TLS, memory, block keepers, metrics and the status page (see the module doc)."""

    # --- network: where the driver endpoint and the block servers bind and what they advertise
    driver_host: str = key(
        "",
        "spark.receivers.driver.host",
        "Host executors reach the driver's endpoint by; '' = spark.driver.host.",
    )
    driver_bind_address: str = key(
        "",
        "spark.receivers.driver.bindAddress",
        "Address the driver's endpoint binds; '' = spark.driver.bindAddress, else the host.",
    )
    driver_ports: str = key(
        "0",
        "spark.receivers.driver.ports",
        "Port or range (40000-40009) of the driver's endpoint; 0 = any free port.",
    )
    executor_host: str = key(
        "",
        "spark.receivers.executor.host",
        "Host a block server advertises; '' = the host Spark knows its executor by.",
    )
    executor_bind_address: str = key(
        "",
        "spark.receivers.executor.bindAddress",
        "Address block servers bind; '' = the advertised host (0.0.0.0: every interface).",
    )
    executor_ports: str = key(
        "0",
        "spark.receivers.executor.ports",
        "Port or range of block servers (one port per receiver); 0 = any free port.",
    )
    # --- TLS on every endpoint and client
    rpc_tls_enabled: bool = key(
        False,
        "spark.receivers.rpc.tls.enabled",
        "Serve and call every endpoint over TLS (needs certFile, keyFile, caFile).",
    )
    rpc_tls_cert_file: str = key(
        "", "spark.receivers.rpc.tls.certFile", "PEM certificate chain every endpoint serves."
    )
    rpc_tls_key_file: str = key(
        "", "spark.receivers.rpc.tls.keyFile", "PEM private key of certFile."
    )
    rpc_tls_ca_file: str = key(
        "", "spark.receivers.rpc.tls.caFile", "PEM CA certificate(s) clients trust."
    )
    rpc_tls_server_name: str = key(
        "",
        "spark.receivers.rpc.tls.serverName",
        "Name clients check certificates for; '' = the host they connect to.",
    )
    rpc_tls_client_auth: bool = key(
        False,
        "spark.receivers.rpc.tls.clientAuth",
        "Mutual TLS: every endpoint refuses a client without a certificate signed by caFile, "
        "and every client presents certFile (needs tls.enabled).",
    )
    # --- deployment
    block_store_memory_bytes: int = key(
        0,
        "spark.receivers.receiver.blockStoreMemory",
        "Memory the blocks kept on one executor take before they spill to disk (512m, 1g): "
        "its block keeper's budget (with keepers off, each receiver's); 0 = derived from "
        "the executor's memory settings.",
    )
    ship_package: str = key(
        "auto",
        "spark.receivers.shipPackage",
        "At start, check that executors import this spark_receivers: auto = ship it "
        "(addPyFile) when they do not; check = fail naming what to pass; off = no check.",
    )
    block_keeper_enabled: bool = key(
        True,
        "spark.receivers.blockKeeper.enabled",
        "Keep blocks in a keeper process per executor (they outlive the receiver's task, "
        "and _2 levels copy them to a second executor); false: in the receiver's task.",
    )
    block_keeper_spool: bool = key(
        True,
        "spark.receivers.blockKeeper.spool",
        "A receiver hands its block to the keeper of its own executor as an Arrow file the "
        "keeper maps (written once, no gRPC copy), and read tasks on that host map it too "
        "while the keeper lives; false: sent by an Arrow Flight put and read over Flight. "
        "Replicas on other executors are always sent by put.",
    )
    lost_block_policy: str = key(
        "fail",
        "spark.receivers.lostBlockPolicy",
        "A block in no store and no WAL: fail (the context fails) or skip (the batch runs "
        "without it; on_block_lost and status() count it).",
    )
    # --- metrics and the status page: spark.receivers.metrics.*, spark.receivers.ui.* -------
    metrics_enabled: bool = key(
        True,
        "spark.receivers.metrics.enabled",
        "Receivers report their counters to the driver (status page, /metrics, status()).",
    )
    metrics_report_interval_ms: int = key(
        1000,
        "spark.receivers.metrics.reportInterval",
        "How often each receiver sends its counters to the driver.",
    )
    ui_enabled: bool = key(
        False,
        "spark.receivers.ui.enabled",
        "Serve the status page, its JSON API and Prometheus /metrics from the driver "
        "(the command line turns it on unless --no-ui).",
    )
    ui_host: str = key(
        "",
        "spark.receivers.ui.host",
        "Address the status page binds to; '' = as the Spark UI: SPARK_LOCAL_IP, else 0.0.0.0.",
    )
    ui_port: int = key(
        4050,
        "spark.receivers.ui.port",
        "First port tried for the status page (then the next ones, spark.port.maxRetries "
        "times, as the Spark UI does); 0 = any free port.",
    )
    ui_retained_batches: int = key(
        1000,
        "spark.streaming.ui.retainedBatches",
        "Completed batches the status page, its API and recent_progress keep.",
    )
