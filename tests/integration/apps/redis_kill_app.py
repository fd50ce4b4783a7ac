"""Zero loss on a cluster: kill -9 the executor JVM of a reliable receiver (Redis stream).

Both WALs on (``--checkpoint``, shared by every process of this one-machine
cluster); a ``RedisStreamReceiver`` acks entries only once they are stored and in
the receiver WAL. A producer thread XADDs ``--records`` entries at ``--rate``;
once a third of them are sent, the executor JVM running the receiver gets
SIGKILL. The receiver must come back on the other executor, and every entry the
source saw acknowledged must be in some batch's output (entries stored but not
acked when the executor died may come twice). One ``RESULT {json}`` line:
executors before/after, sent, acked, delivered, duplicated, lost.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import threading
import time

import redis
from pyspark.sql import SparkSession

from spark_receivers import RedisStreamReceiver, StreamingConfig, StreamingContext


def executor_pid(executor_id: str, app_id: str) -> int | None:
    """The pid of this application's executor JVM ``executor_id`` (from /proc)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if (
            "--executor-id" in args
            and args[args.index("--executor-id") + 1] == executor_id
            and app_id in args
        ):
            return int(entry)
    return None


def wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return bool(predicate())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--redis-url", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--records", type=int, default=6000)
    p.add_argument("--rate", type=float, default=300.0)
    args = p.parse_args()
    client = redis.Redis.from_url(args.redis_url)
    stream, group = f"cluster-kill-{os.getpid()}", "spark"
    spark = SparkSession.builder.appName("redis-kill-app").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    app_id = spark.sparkContext.applicationId
    config = StreamingConfig(receiver_wal_enabled=True, receiver_restart_delay_ms=500)
    ssc = StreamingContext(spark, 1000, checkpoint_dir=args.checkpoint, config=config)
    seen: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def collect(df, batch_time_ms: int) -> None:
        values = [r.value for r in df.collect()]
        with lock:
            seen.update(values)

    receiver = RedisStreamReceiver(stream, group, url=args.redis_url, claim_min_idle_ms=1000)
    ssc.receiver_stream(receiver).foreach_batch(collect)
    ssc.start()
    out: dict = {"app_id": app_id}
    sent: list[str] = []

    def produce() -> None:
        pause = threading.Event()
        for n in range(args.records):
            client.xadd(stream, {"value": f"r-{n}"})
            sent.append(f"r-{n}")
            pause.wait(1 / args.rate)

    try:
        out["placed"] = wait(lambda: ssc.status().receiver(0).state == "ACTIVE", 120)
        first = ssc.status().receiver(0)
        out["before"] = {"executor": first.executor_id, "host": first.host}
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        wait(lambda: len(sent) >= args.records // 3 and sum(seen.values()) > 0, 120)
        pid = executor_pid(str(first.executor_id), app_id)
        out["killed"] = {"executor": first.executor_id, "pid": pid, "sent_before_kill": len(sent)}
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

        def moved() -> bool:
            r = ssc.status().receiver(0)
            return r.state == "ACTIVE" and r.executor_id not in (None, first.executor_id)

        out["moved"] = wait(moved, 120)
        after = ssc.status().receiver(0)
        out["after"] = {"executor": after.executor_id, "host": after.host}
        producer.join(120)

        def all_acked() -> bool:
            info = client.xinfo_groups(stream)[0]
            pending = int(info["pending"])
            last = client.xrevrange(stream, count=1)[0][0]
            return pending == 0 and info["last-delivered-id"] == last

        out["all_acked"] = wait(all_acked, 120)
        expected = set(sent)
        wait(lambda: expected <= set(seen), 60)
    finally:
        ssc.stop(graceful=True)
    info = client.xinfo_groups(stream)[0]
    pending = {e["message_id"] for e in client.xpending_range(stream, group, "-", "+", 100_000)}
    entries = client.xrange(stream)
    acked = {fields[b"value"].decode() for eid, fields in entries if eid not in pending}
    with lock:
        delivered = set(seen)
        out.update(
            sent=len(sent),
            acked=len(acked),
            pending=int(info["pending"]),
            delivered=len(delivered & set(sent)),
            duplicated=sum(c - 1 for c in seen.values() if c > 1),
            lost=len(acked - delivered),
        )
    out["failure"] = ssc.status().failure
    print("RESULT " + json.dumps(out, default=str), flush=True)
    client.delete(stream)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
