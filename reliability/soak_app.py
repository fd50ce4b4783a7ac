"""The soak's driver: a streaming word count over a Redis stream, both WALs on.

``python reliability/soak_app.py --master spark://... --redis-url ... --checkpoint DIR``:
``RedisStreamReceiver`` (XACK after the reliable store) → every batch: split lines into
words, count them per word, keep the top 10 (a shuffle and a collect per batch, as a
word count does). One JSON line per completed batch on stdout (``{"batch": t,
"records": n, "proc_ms": p, "delay_ms": d}``) for the harness. Ctrl-C stops gracefully.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_receivers import RedisStreamReceiver, StreamingContext, StreamingListener


class BatchLines(StreamingListener):
    def on_batch_completed(self, info) -> None:
        line = {
            "batch": info.batch_time_ms,
            "records": info.num_records,
            "proc_ms": info.processing_delay_ms,
            "delay_ms": info.scheduling_delay_ms,
        }
        print(json.dumps(line), flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--master", required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--stream", default="soak")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--batch-ms", type=int, default=1000)
    p.add_argument("--read-batch", type=int, default=5000)
    p.add_argument("--conf", action="append", default=[])
    a = p.parse_args()
    builder = SparkSession.builder.master(a.master).appName("spark-receivers-soak")
    for item in a.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    builder = builder.config("spark.streaming.receiver.writeAheadLog.enable", "true")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")

    def create() -> StreamingContext:
        ssc = StreamingContext(spark, a.batch_ms, checkpoint_dir=a.checkpoint)
        receiver = RedisStreamReceiver(a.stream, "soak", url=a.redis_url, batch=a.read_batch)

        def word_count(df, batch_time_ms: int) -> None:
            words = df.select(F.explode(F.split("value", " ")).alias("word"))
            words.groupBy("word").count().orderBy(F.desc("count")).limit(10).collect()

        ssc.receiver_stream(receiver).foreach_batch(word_count)
        return ssc

    ssc = StreamingContext.get_or_create(a.checkpoint, create)
    ssc.add_streaming_listener(BatchLines())
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ssc.start()
    print(json.dumps({"started": True}), flush=True)
    while not stop.wait(1.0):
        if ssc.status().failure:
            print(json.dumps({"failure": ssc.status().failure}), flush=True)
            break
    ssc.stop(graceful=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
