"""The status page server, its JSON API and /metrics, over real HTTP on loopback (no Spark)."""

from __future__ import annotations

import base64
import json
import re
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_receivers.driver.observe.listener import BatchInfo, OutputOperationInfo, StreamInputInfo
from spark_receivers.driver.observe.progress import ProgressRecorder
from spark_receivers.driver.observe.prometheus import BatchMetrics, ReceiverCollector, new_registry
from spark_receivers.driver.observe.receiver_metrics import ReceiverMetricsInfo
from spark_receivers.driver.observe.status import ReceiverStatus, StreamingStatus
from spark_receivers.driver.observe.status_api import StatusApi, StreamDescription
from spark_receivers.driver.observe.streaming_progress import StateOperatorProgress
from spark_receivers.driver.observe.ui_server import StatusServer
from spark_receivers.errors import ConfigError

SECRET = "s3cret-of-the-app"


def status() -> StreamingStatus:
    r = ReceiverStatus(
        0, "SocketTextReceiver-0", "ACTIVE", "driver", "127.0.0.1", "127.0.0.1:1", 1200, 6, 2,
        last_error_message="connection reset", last_error_time_ms=1_700_000_000_000,
    )  # fmt: skip
    return StreamingStatus(
        "ACTIVE", 1000, (r,), batches_completed=3, records_received=1200, records_processed=900,
        pending_batches_ms=(4000,), rate_limits={0: 500.0},
    )  # fmt: skip


def metrics() -> dict[int, ReceiverMetricsInfo]:
    counts = tuple(3 if i == 2 else 0 for i in range(14))
    info = ReceiverMetricsInfo(
        0, "driver", reports=4, last_report_ms=5, records=1200, bytes=48_000, blocks=6,
        blocks_refused=1, records_refused=10, input_rate=400.0, rate_limit=600.0,
        throttled_s=1.5, bad_records=2, bad_record_policy="dead_letter",
        store_memory_bytes=4096, store_disk_bytes=1024, store_blocks=2,
        add_block_counts=counts, add_block_sum_s=0.012, max_rate=2000.0,
    )  # fmt: skip
    return {0: info}


def batch(t: int, records: int, failed: bool = False) -> BatchInfo:
    op = OutputOperationInfo(t, 0, "count", "count", t + 10, t + 250, "boom" if failed else None)
    inputs = StreamInputInfo(0, records, 2, 8000, ({"offset": t},), 0)
    return BatchInfo(t, {0: records}, t, t + 10, t + 250, {0: op}, {0: inputs})


@pytest.fixture
def parts():
    registry = new_registry()
    batches = BatchMetrics(registry)

    def state_operators(t: int) -> list[StateOperatorProgress]:
        saved = (7, 640) if t == 2000 else (0, 0)  # saved to the checkpoint at 2000 only
        return [StateOperatorProgress("map_with_state", "window-0", t // 100, 12, *saved)]

    progress = ProgressRecorder(
        1000, lambda: {}, keep=10, describe=lambda s: f"stream {s}", state_operators=state_operators
    )
    for i, t in enumerate((1000, 2000, 3000)):
        info = batch(t, 300 * (i + 1), failed=t == 3000)
        progress.on_batch_completed(info)
        batches.on_batch_completed(info)
    registry.register(ReceiverCollector(status, metrics))
    streams = [StreamDescription(0, "SocketTextReceiver-0", "batch", "SocketTextReceiver")]
    api = StatusApi(streams, status, metrics, lambda: progress.recent, 500, "an-app")
    return api, registry


def serve(parts, secret=None, port=0, retries=16):
    api, registry = parts
    server = StatusServer(api, registry, "127.0.0.1", port, max_retries=retries, secret=secret)
    server.start()
    return server


def get(url: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_page_api_and_metrics_are_served(parts):
    server = serve(parts)
    try:
        base = server.url
        code, headers, body = get(base)
        assert code == 200 and headers["Content-Type"].startswith("text/html")
        assert b'id="chart-input-rate"' in body and b"static/status.js" in body
        assert b'id="streams"' in body and b'id="receivers"' in body
        assert b"http://" not in body.replace(b"http://www.w3.org", b"")  # no CDN
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        code, _, js = get(base + "static/status.js")
        assert code == 200 and b"api/v1/receivers" in js and b"https://" not in js

        stats = json.loads(get(base + "api/v1/statistics")[2])
        assert stats["numReceivedRecords"] == 1200 and stats["numActiveReceivers"] == 1
        assert stats["numRetainedCompletedBatches"] == 3 and stats["batchDuration"] == 1000
        assert stats["avgInputRate"] == pytest.approx(450.0)  # the two batches that succeeded
        (stream,) = json.loads(get(base + "api/v1/streams")[2])
        assert stream == {
            "streamId": 0, "streamName": "SocketTextReceiver-0", "kind": "batch",
            "receiverType": "SocketTextReceiver", "numReceivedRecords": 1200,
            "inputRate": 400.0, "rateLimit": 500.0,
        }  # fmt: skip
        (receiver,) = json.loads(get(base + "api/v1/receivers")[2])
        assert receiver["isActive"] and receiver["state"] == "ACTIVE"
        assert receiver["rateLimit"] == 500.0  # what backpressure published wins
        assert (receiver["badRecords"], receiver["badRecordPolicy"]) == (2, "dead_letter")
        assert receiver["addBlockMeanMs"] == pytest.approx(4.0)
        assert receiver["lastErrorMessage"] == "connection reset" and receiver["restarts"] == 1
        batches = json.loads(get(base + "api/v1/batches?limit=2")[2])
        assert [b["batchTime"] for b in batches] == [2000, 3000]
        assert batches[1]["status"] == "FAILED" and batches[1]["firstFailureReason"] == "boom"
        assert batches[0]["streams"][0]["metadata"] == [{"offset": 2000}]
        assert batches[0]["processingTime"] == 240 and batches[0]["schedulingDelay"] == 10
        assert batches[0]["stateOperators"] == [
            {"operatorName": "map_with_state", "numRowsTotal": 20, "allUpdatesTimeMs": 12,
             "commitTimeMs": 7, "customMetrics": {"stateName": "window-0", "savedBytes": 640}}
        ]  # fmt: skip
        assert batches[1]["stateOperators"][0]["customMetrics"]["savedBytes"] == 0
        assert get(base + "api/v1/batches?limit=x")[0] == 400

        code, headers, text = get(base + "metrics")
        assert code == 200 and headers["Content-Type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(text.decode())}
        value = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families.values()
            for s in f.samples
        }
        key = (("receiver", "SocketTextReceiver-0"), ("stream", "0"))
        assert value[("spark_receivers_records_received_total", key)] == 1200
        assert value[("spark_receivers_bytes_received_total", key)] == 48_000
        assert value[("spark_receivers_block_store_memory_bytes", key)] == 4096
        assert value[("spark_receivers_rate_limit_records_per_second", key)] == 500.0
        assert value[("spark_receivers_max_rate_records_per_second", key)] == 2000.0
        assert value[("spark_receivers_throttled_seconds_total", key)] == 1.5
        bad = (("policy", "dead_letter"), *key)
        assert value[("spark_receivers_bad_records_total", tuple(sorted(bad)))] == 2
        assert value[("spark_receivers_add_block_latency_seconds_count", key)] == 3
        assert value[("spark_receivers_batch_processing_seconds_count", ())] == 3
        assert value[("spark_receivers_batches_completed_total", (("outcome", "failed"),))] == 1
        assert value[("spark_receivers_records_processed_total", (("stream", "0"),))] == 900
        assert families["spark_receivers_batch_total_delay_seconds"].type == "histogram"
        # Prometheus conventions: snake_case, prefixed, base units, _total only on counters
        for f in families.values():
            assert re.fullmatch(r"spark_receivers_[a-z0-9_]+", f.name), f.name
            assert not re.search(r"_(ms|milliseconds|kb|mb)(_|$)", f.name), f.name
            for s in f.samples:
                if not s.name.endswith("_created"):  # prometheus-client's creation times
                    assert s.name.endswith("_total") == (f.type == "counter"), s.name
    finally:
        server.stop()


def test_with_a_secret_every_request_needs_it(parts):
    server = serve(parts, secret=SECRET)
    try:
        base = server.url
        code, headers, _ = get(base + "api/v1/receivers")
        assert code == 401 and headers["WWW-Authenticate"].startswith("Basic")
        assert get(base + "metrics", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(base, {"Authorization": "Basic !!!"})[0] == 401
        assert get(base + "metrics", {"Authorization": f"Bearer {SECRET}"})[0] == 200
        basic = base64.b64encode(f"anyone:{SECRET}".encode()).decode()
        assert get(base, {"Authorization": f"Basic {basic}"})[0] == 200
    finally:
        server.stop()


def test_a_taken_port_moves_to_the_next_one_and_a_full_range_fails_clearly(parts):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = serve(parts, port=port)
        try:
            assert server.port != port and server.port <= port + 16
        finally:
            server.stop()
        with pytest.raises(ConfigError, match=r"spark.receivers.ui.port.*spark.port.maxRetries"):
            serve(parts, port=port, retries=0)
