"""kill -9 of the executor JVM of the Redis receiver between its store and its XACK.

Run as its own process (local-cluster: real executor JVMs); prints one ``RESULT {json}``
line that tests/integration/test_exactly_once.py asserts on. The receiver WAL is on. The
receiver, once it has stored 500 entries, kills its own executor's JVM after storing a
batch and before acking it; the tracker relaunches it on the other executor, which finds
the batch pending and the driver's accepted range covering it: acked, not stored again.

Usage: ``redis_executor_kill_scenario.py REDIS_URL WORK_DIR``.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from processes import holds_within
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from spark_receivers import StreamingConfig, StreamingContext
from spark_receivers.receivers import RedisStreamReceiver

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import tests


def executor_jvm_of(pid: int) -> int | None:
    """The executor JVM among the ancestors of process ``pid`` (from /proc)."""
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"CoarseGrainedExecutorBackend" in f.read():
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return None


class ExecutorKilledBeforeAck(RedisStreamReceiver):
    def __init__(self, *args, marker: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marker = marker

    def _ack(self, client, ids):
        if self.records_stored >= 500 and not os.path.exists(self.marker):
            jvm = executor_jvm_of(os.getpid())
            Path(self.marker).write_text(f"{jvm} {','.join(ids)}")
            if jvm is not None:
                os.kill(jvm, signal.SIGKILL)  # the batch is stored, not acked
                time.sleep(60)  # dies with it
        super()._ack(client, ids)


def main() -> int:
    import redis

    url, work = sys.argv[1], Path(sys.argv[2])
    spark = (
        SparkSession.builder.master("local-cluster[2,2,1024]")
        .config("spark.executor.cores", "2")
        .config("spark.cores.max", "4")
        .config("spark.driver.host", "127.0.0.1")
        .appName("spark-receivers-redis-executor-kill")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executor.memory", "512m")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    stream, group = f"exec-{uuid.uuid4().hex[:8]}", "spark"
    client = redis.Redis.from_url(url, decode_responses=True)
    sent = [f"entry {chunk} {i}" for chunk in range(30) for i in range(100)]
    marker = work / "killed"
    config = StreamingConfig(
        receiver_wal_enabled=True, receiver_restart_delay_ms=300, receiver_drain_timeout_s=10.0
    )
    ssc = StreamingContext(spark, 1000, checkpoint_dir=str(work / "ckpt"), config=config)
    seen: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def collect(df, batch_time_ms) -> None:
        values = [r.value for r in df.collect()]
        with lock:
            seen.update(values)

    receiver = ExecutorKilledBeforeAck(
        stream, group, url=url, block_ms=200, batch=100, marker=str(marker)
    )
    ssc.receiver_stream(receiver).foreach_batch(collect)
    ssc.start()
    out: dict = {}
    try:
        for chunk in range(30):
            pipe = client.pipeline()
            for value in sent[chunk * 100 : (chunk + 1) * 100]:
                pipe.xadd(stream, {"value": value})
            pipe.execute()
            time.sleep(0.1)
        out["killed"] = holds_within(marker.exists, 300)
        out["executor_before"] = marker.read_text().split()[0] if marker.exists() else None

        def everything() -> bool:
            with lock:
                return set(sent) <= set(seen)

        out["all_arrived"] = holds_within(everything, 300)
        out["no_pending"] = holds_within(
            lambda: client.xpending(stream, group)["pending"] == 0, 120
        )
        out["receiver_executor_after"] = ssc.status().receiver(0).executor_id
    finally:
        ssc.stop(graceful=True)
        client.close()
    with lock:
        out["missing"] = len(set(sent) - set(seen))
        out["duplicated"] = sum(c - 1 for c in seen.values() if c > 1)
        out["unexpected"] = len(set(seen) - set(sent))
    out["failure"] = ssc.status().failure
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
