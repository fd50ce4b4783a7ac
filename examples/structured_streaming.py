"""A receiver stream read by Structured Streaming: windowed word counts with a watermark.

    python examples/structured_streaming.py --seconds 30 --checkpoint /tmp/sr-example

The receiver (here the built-in generator of numbered lines of words; any receiver
works) runs on Spark as usual; ``include_timestamp=True`` gives each line a
``timestamp`` column (when it was made), the event time the windows and the
watermark use; instead of DStream batches its blocks go to a block
log on the driver, and ``read_stream()`` gives a streaming DataFrame over it. With
the receiver WAL on and both checkpoints kept (``--checkpoint``), killing this
process and starting it again loses nothing and counts nothing twice in an
exactly-once sink (the console sink of this example only shows the results).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_receivers import GeneratorReceiver, StreamingConfig, StreamingContext


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="how long to run")
    p.add_argument("--rate", type=int, default=2000, help="lines/s the generator offers")
    p.add_argument("--max-records-per-trigger", type=int, default=5000)
    p.add_argument("--checkpoint", default="/tmp/spark-receivers-structured-example")
    args = p.parse_args()

    spark = (
        SparkSession.builder.master("local[4]")
        .appName("spark-receivers-structured-streaming")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ours = os.path.join(args.checkpoint, "receivers")

    def create() -> StreamingContext:
        config = StreamingConfig(receiver_wal_enabled=True)
        ssc = StreamingContext(spark, 1000, checkpoint_dir=ours, config=config)
        ssc.structured_stream(GeneratorReceiver(rate=args.rate, include_timestamp=True))
        return ssc

    ssc = StreamingContext.get_or_create(ours, create)
    ssc.start()
    (lines,) = ssc.streams
    words = lines.read_stream(max_records_per_trigger=args.max_records_per_trigger).select(
        F.col("timestamp").alias("ts"),  # when the generator made the line: the event time
        F.explode(F.split(F.col("value"), " ")).alias("word"),
    )
    counts = (
        words.where(~F.col("word").rlike("^[0-9]+$"))  # drop the sequence numbers
        .withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "5 seconds"), "word")
        .count()
    )
    query = (
        counts.writeStream.outputMode("update")
        .format("console")
        .option("truncate", False)
        .option("numRows", 10)
        .option("checkpointLocation", os.path.join(args.checkpoint, "query"))
        .trigger(processingTime="2 seconds")
        .start()
    )
    try:
        query.awaitTermination(args.seconds)
    finally:
        # Stop between two triggers: a trigger stopped in the middle of its write is
        # aborted, and Spark logs that as an error. On a busy machine a trigger can take
        # longer than 10 s (seen beside stress-ng on 2026-11-27), so wait up to a minute.
        deadline = time.monotonic() + 60
        while query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.05)
        query.stop()  # the query first: it reads through the context's tracker
        ssc.stop(graceful=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
