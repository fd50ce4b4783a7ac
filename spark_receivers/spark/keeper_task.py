"""The short Spark job that starts a block keeper on executors that run no receiver.

Replicas of a ``_2`` storage level go to the keeper of *another* executor, so every
executor needs one, not only those running receivers (whose supervisors start
their own). The driver runs this job with one task per executor that has no
keeper, each preferring its executor; each task starts (or finds) its
executor's keeper and registers it with the driver's tracker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["KeeperTaskSpec", "make_keeper_task"]


@dataclass(frozen=True)
class KeeperTaskSpec:
    """What a keeper task needs: pickled with the task by PySpark."""

    tracker_address: str
    secret: str
    config: dict[str, Any]
    """The context's :class:`~spark_receivers.config.StreamingConfig`, as a dict."""


def make_keeper_task(spec: KeeperTaskSpec) -> Callable[[Iterator[Any]], Iterator[str]]:
    """The ``mapPartitions`` function: start this executor's keeper, register it."""

    def run(_: Iterator[Any]) -> Iterator[str]:
        from spark_receivers.config import StreamingConfig
        from spark_receivers.receiver.block_placement import keeper_settings
        from spark_receivers.receiver.keeper_process import ensure_local_keeper
        from spark_receivers.rpc import messages as m
        from spark_receivers.rpc.hosts import executor_network
        from spark_receivers.rpc.transport import EndpointClient
        from spark_receivers.spark.receiver_task import executor_id

        config = StreamingConfig(**spec.config)
        host = executor_network(config, spec.tracker_address.rsplit(":", 1)[0]).advertise_host
        executor = executor_id()
        keeper = ensure_local_keeper(keeper_settings(spec.secret, host, config))
        client = EndpointClient(spec.tracker_address, spec.secret, tls=config.tls)
        try:
            client.call(m.RegisterBlockKeeper(executor, host, keeper.address))
        finally:
            client.close()
        yield f"{executor} {keeper.address}"

    return run
