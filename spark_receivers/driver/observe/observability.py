"""What a running context shows of itself: Prometheus metrics and the status page.

:class:`Observability` is made with the context. It owns the context's
Prometheus registry (batch histograms fed by the listener bus from the start)
and, from :meth:`Observability.start` on, reads the running parts through
callables: the scheduler's ``status()``, the receivers' metrics reports and the
progress recorder. With ``spark.receivers.ui.enabled`` it serves the status
page, its JSON API and ``/metrics`` (``driver/observe/ui_server.py``); without it the
registry is still there for an application's own exporter
(``ssc.metrics_registry``).

Start after the scheduler started; stop after it stopped (the page shows the
final counts until then).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.observe.listener import ListenerBus
from spark_receivers.driver.observe.progress import ProgressRecorder
from spark_receivers.driver.observe.prometheus import BatchMetrics, ReceiverCollector, new_registry
from spark_receivers.driver.observe.receiver_metrics import ReceiverMetricsInfo
from spark_receivers.driver.observe.status import StreamingStatus
from spark_receivers.driver.observe.status_api import StatusApi, StreamDescription
from spark_receivers.driver.observe.ui_server import StatusServer
from spark_receivers.rpc.hosts import literal_address, local_host

log = logging.getLogger(__name__)

__all__ = ["Observability", "ui_bind_host"]

ALL_INTERFACES = "0.0.0.0"
"""What the Spark UI binds to without SPARK_LOCAL_IP."""


def ui_bind_host(config: StreamingConfig, environ: Mapping[str, str] | None = None) -> str:
    """Where the status page binds: ``spark.receivers.ui.host``, SPARK_LOCAL_IP, all.

    One literal address (a name is resolved once: it could stand for several).
    """
    env = os.environ if environ is None else environ
    if config.ui_host:
        return literal_address(config.ui_host, "spark.receivers.ui.host")
    ip = env.get("SPARK_LOCAL_IP")
    return literal_address(ip, "SPARK_LOCAL_IP") if ip else ALL_INTERFACES


class Observability:
    """The registry, the API and the status page of one context; see the module doc.

    ``spark_conf`` gives ``spark.port.maxRetries`` and ``spark.authenticate.secret``
    (when set, the page requires it) and the host to advertise.
    """

    def __init__(
        self,
        config: StreamingConfig,
        bus: ListenerBus,
        progress: ProgressRecorder,
        spark_conf: Mapping[str, str],
    ) -> None:
        self._config = config
        self._progress = progress
        self._conf = dict(spark_conf)
        self.registry: CollectorRegistry = new_registry()
        bus.add(BatchMetrics(self.registry))
        self.api: StatusApi | None = None
        self._collector: ReceiverCollector | None = None
        self._server: StatusServer | None = None

    @property
    def url(self) -> str | None:
        """The status page's URL while it is served."""
        return self._server.url if self._server is not None else None

    def start(
        self,
        streams: Sequence[StreamDescription],
        status: Callable[[], StreamingStatus],
        metrics: Callable[[], dict[int, ReceiverMetricsInfo]],
        start_time_ms: int,
        app_name: str = "",
    ) -> str | None:
        """Collect the running parts' metrics; serve the page if enabled; return its URL."""
        self._collector = ReceiverCollector(status, metrics)
        self.registry.register(self._collector)
        self.api = StatusApi(
            streams, status, metrics, lambda: self._progress.recent, start_time_ms, app_name
        )
        if not self._config.ui_enabled:
            return None
        host = ui_bind_host(self._config)
        retries = self._conf.get("spark.port.maxRetries", "16")
        server = StatusServer(
            self.api,
            self.registry,
            host,
            self._config.ui_port,
            max_retries=int(retries) if retries.isdigit() else 16,
            secret=self._conf.get("spark.authenticate.secret") or None,
            advertised_host=local_host(self._conf) if host == ALL_INTERFACES else host,
        )
        url = server.start()
        self._server = server
        return url

    def stop(self) -> None:
        """Stop serving the page; idempotent (the registry stays readable)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
