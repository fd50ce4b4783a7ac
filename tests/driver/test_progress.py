"""Progress records in Structured Streaming's shape, and the Spark UI descriptions of jobs."""

from __future__ import annotations

import json
import threading
import time

from spark_receivers import StreamingListener, StreamingProgress
from spark_receivers.driver.batches.job_generator import describe_batch, stream_input_info
from spark_receivers.driver.observe.listener import (
    MAX_METADATA_PER_STREAM,
    BatchCompleted,
    BatchInfo,
    ListenerBus,
    OutputOperationInfo,
)
from spark_receivers.driver.observe.progress import ProgressRecorder
from spark_receivers.driver.observe.streaming_progress import iso_time, stream_uuid
from spark_receivers.driver.tracking.receiver_launcher import describe_receiver_job
from spark_receivers.driver.tracking.scheduling_policy import (
    ExecutorCacheTaskLocation,
    HostTaskLocation,
    ReceiverState,
)
from spark_receivers.rpc.messages import ReceivedBlockInfo

T = 1_764_000_000_000  # a batch time on a 2 s grid


def info() -> BatchInfo:
    blocks = [
        ReceivedBlockInfo(
            0, f"input-0-1-{i}", 100, T - 2000, "h:1", 4000, metadata=meta, position=position
        )
        for i, (meta, position) in enumerate(
            [({"offset": 10}, "p1"), (None, "p2"), ({"offset": 30}, None)]
        )
    ]
    ops = {
        0: OutputOperationInfo(T, 0, "write", "write", T + 100, T + 400),
        1: OutputOperationInfo(T, 1, "count", "count", T + 400, T + 600),
    }
    return BatchInfo(
        T, {0: 300, 1: 0}, T, T + 100, T + 600, ops,
        {0: stream_input_info(0, blocks), 1: stream_input_info(1, [])},
    )  # fmt: skip


def test_a_batch_becomes_a_progress_with_structured_streaming_names():
    states = {0: ReceiverState.ACTIVE, 1: ReceiverState.SCHEDULED}
    recorder = ProgressRecorder(2000, lambda: states, describe=lambda s: f"stream-{s}")
    recorder.new_run(stream_uuid("/ckpt"))
    recorder.on_batch_completed(info())
    p = recorder.last
    assert isinstance(p, StreamingProgress) and recorder.recent == [p]
    assert p.id == stream_uuid("/ckpt") != stream_uuid("/other")  # stable per checkpoint
    assert p.batch_id == T // 2000
    assert (p.num_input_rows, p.input_rows_per_second) == (300, 150.0)
    assert p.processed_rows_per_second == 600.0  # 300 rows in 500 ms of processing
    assert (p.batch_duration_ms, p.scheduling_delay_ms, p.total_delay_ms) == (500, 100, 600)
    doc = json.loads(p.json())
    assert doc == json.loads(p.prettyJson()) and p["batchId"] == doc["batchId"]
    assert doc["timestamp"] == iso_time(T) and doc["timestamp"].endswith(".000Z")
    assert doc["durationMs"] == {
        "triggerExecution": 500, "addBatch": 500, "schedulingDelay": 100, "totalDelay": 600,
    }  # fmt: skip
    source = doc["sources"][0]
    assert source["description"] == "stream-0" and source["numInputRows"] == 300
    assert (source["startOffset"], source["endOffset"]) == ({"offset": 10}, {"offset": 30})
    assert source["metadata"] == [{"offset": 10}, {"offset": 30}]
    assert source["metrics"] == {"numBlocks": "3", "sizeBytes": "12000"}
    assert source["position"] == "p2"  # the last block stored with a position
    assert doc["sources"][1]["startOffset"] is None
    assert doc["sources"][1]["position"] is None
    assert doc["receivers"] == {"0": "ACTIVE", "1": "SCHEDULED"}
    assert [o["name"] for o in doc["outputOperations"]] == ["write", "count"]
    assert doc["sink"]["description"] == "foreach_batch[write, count]"
    assert doc["failed"] is False


def test_batch_progress_reaches_listeners_right_after_batch_completed():
    bus = ListenerBus()
    seen: list[tuple[str, object]] = []
    got = threading.Event()

    class Listener(StreamingListener):
        def on_batch_completed(self, i):
            seen.append(("completed", i.batch_time_ms))

        def on_batch_progress(self, progress):
            seen.append(("progress", progress.batch_time_ms))
            got.set()

    recorder = ProgressRecorder(2000, dict, bus)
    bus.add(recorder)
    bus.add(Listener())
    bus.start()
    try:
        bus.post(BatchCompleted(info()))
        assert got.wait(10)
    finally:
        bus.stop()
    assert seen == [("completed", T), ("progress", T)]


def test_the_last_metadata_is_kept_when_a_batch_has_too_many():
    blocks = [
        ReceivedBlockInfo(0, f"input-0-1-{i}", 1, 0, None, metadata={"i": i})
        for i in range(MAX_METADATA_PER_STREAM + 50)
    ]
    inputs = stream_input_info(0, blocks)
    assert len(inputs.metadata) == MAX_METADATA_PER_STREAM
    assert inputs.metadata[-1] == {"i": MAX_METADATA_PER_STREAM + 49}
    assert inputs.metadata_omitted == 50 and inputs.num_blocks == len(blocks)


def test_spark_ui_descriptions_of_batch_and_receiver_jobs():
    when = time.strftime("%H:%M:%S", time.localtime(T / 1000))
    assert describe_batch(T) == f"Streaming batch {when}"
    assert describe_batch(T, "write") == f"Streaming batch {when} [output op write]"
    assert describe_batch(T + 250).endswith(".250")
    assert (
        describe_receiver_job(0, "SocketTextReceiver-0", [ExecutorCacheTaskLocation("h", "3")])
        == "Receiver 0: SocketTextReceiver-0 on executor 3"
    )
    assert describe_receiver_job(1, "X-1", [HostTaskLocation("h2")]) == "Receiver 1: X-1 on h2"
    assert describe_receiver_job(2, "Y-2", []) == "Receiver 2: Y-2 on any executor"
