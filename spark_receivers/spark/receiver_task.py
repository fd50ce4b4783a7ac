"""The body of a receiver's one-task Spark job (runs in a Python worker on an executor)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from spark_receivers.config import StreamingConfig
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.rpc.hosts import (
    executor_jvm,
    executor_network,
    literal_address,
    local_host,
    spark_executor_host,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverTaskSpec:
    """What a receiver's task needs: pickled with the task by PySpark."""

    receiver: Receiver
    stream_id: int
    tracker_address: str
    secret: str = field(repr=False)  # never in a log line or an error
    config: dict[str, Any]
    app_id: str = ""
    """The Spark application id, for receivers that name their job (MQTT client ids)."""


def executor_host() -> str:
    """The address listening receivers on this executor bind to and advertise.

    The host Spark knows this executor by
    (:func:`spark_receivers.rpc.hosts.spark_executor_host`), else
    :func:`spark_receivers.rpc.hosts.local_host` (local mode); one literal address.
    """
    known = spark_executor_host()
    return literal_address(known, "the executor's host") if known else local_host()


def executor_id() -> str:
    """The id of the executor this Python worker belongs to ("driver" in local mode).

    A Python worker is a child of its executor's JVM (through PySpark's daemon),
    whose command line carries ``--executor-id``; Kubernetes executors also have
    ``SPARK_EXECUTOR_ID`` in their environment.
    """
    found = os.environ.get("SPARK_EXECUTOR_ID")
    if found:
        return found
    jvm = executor_jvm()
    return (jvm.flag("--executor-id") if jvm else None) or "driver"


def make_task_function(spec: ReceiverTaskSpec) -> Callable[[Iterator[Any]], Iterator[str]]:
    """Return the ``mapPartitions`` function that runs the receiver's supervisor.

    A task attempt other than the first returns at once: the tracker, not
    Spark's task retry, decides where a receiver restarts.
    """

    def run(_: Iterator[Any]) -> Iterator[str]:
        from pyspark import TaskContext

        from spark_receivers.receiver.supervisor import ReceiverSupervisor

        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() != 0:
            return
        _configure_worker_logging()
        config = StreamingConfig(**spec.config)
        # Executors do not see the driver's Spark conf: the network keys come in the spec.
        network = executor_network(config, spec.tracker_address.rsplit(":", 1)[0])
        supervisor = ReceiverSupervisor(
            spec.receiver,
            spec.stream_id,
            spec.tracker_address,
            spec.secret,
            config,
            network.advertise_host,
            executor_id(),
            app_id=spec.app_id,
        )
        supervisor.start()
        supervisor.await_termination()
        yield f"receiver {spec.stream_id} stopped after {supervisor.records_stored} records"

    return run


def _configure_worker_logging() -> None:
    root = logging.getLogger("spark_receivers")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("SPARK_RECEIVERS_LOG_LEVEL", "WARNING"))
