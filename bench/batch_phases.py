"""Where one spark-receivers batch spends its time: our block read path vs Spark alone.

    python -m bench.batch_phases --blocks 5 --lines 20000 --iterations 12

Serves ``--lines`` load-generator lines as ``--blocks`` Arrow blocks from a Flight block
server in this process (the receiver's role), then times, per iteration on local Spark:

- ``build``: ``block_source.blocks_dataframe`` (the driver builds the batch's DataFrame);
- ``count_ds`` / ``wc_ds``: a line count / the benchmark's word count over that DataFrame
  (reads every block in mapInArrow tasks through Flight);
- ``count_cached`` / ``wc_cached``: the same over the same lines cached in Spark (Spark alone).

``*_ds - *_cached`` is what our read path adds to a batch. Prints every iteration and the
medians (iterations after the first two, which pay cold Python workers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from bench.child import warmup_lines
from bench.pipelines import word_count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batch_phases", description=__doc__)
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--lines", type=int, default=20_000)
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--master", default="local[4]")
    p.add_argument("--partitions", type=int, default=None, help="read tasks (default: Spark's)")
    p.add_argument(
        "--chunk-lines",
        type=int,
        default=0,
        help="lines per Arrow chunk of a block, as a socket receiver's reads make them "
        "(~2,600 for its 256 KiB reads); 0: one chunk per block",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.pandas.types import from_arrow_schema

    from spark_receivers.receiver.schema import DEFAULT_SCHEMA
    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.auth import new_secret
    from spark_receivers.rpc.transport import FlightEndpoint
    from spark_receivers.spark import block_source

    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    secret = new_secret()
    lines = warmup_lines(args.lines)
    per = len(lines) // args.blocks

    def block(part: list[str]) -> pa.Table:
        step = args.chunk_lines or len(part) or 1
        chunks = [pa.array(part[j : j + step], pa.string()) for j in range(0, len(part), step)]
        return pa.table({"value": pa.chunked_array(chunks, pa.string())})

    tables = {f"input-0-1-{i}": block(lines[i * per : (i + 1) * per]) for i in range(args.blocks)}
    server = FlightEndpoint(
        "phases", "127.0.0.1", secret, m.SUPERVISOR_MESSAGES, lambda _: True,
        lambda ticket: tables[ticket.decode()],
    )  # fmt: skip
    infos = [
        m.ReceivedBlockInfo(0, name, t.num_rows, 0, server.address, t.nbytes)
        for name, t in tables.items()
    ]
    schema = from_arrow_schema(DEFAULT_SCHEMA)

    cached = spark.createDataFrame([(line,) for line in lines], "value string").cache()
    cached.count()
    phases: dict[str, list[float]] = {
        k: [] for k in ("build", "count_ds", "wc_ds", "count_cached", "wc_cached")
    }
    try:
        for it in range(args.iterations):
            t: dict[str, float] = {}
            s = time.perf_counter()
            df = block_source.blocks_dataframe(
                spark, infos, schema, secret, max_partitions=args.partitions
            )
            t["build"] = time.perf_counter() - s
            s = time.perf_counter()
            assert df.count() == per * args.blocks
            t["count_ds"] = time.perf_counter() - s
            s = time.perf_counter()
            assert (
                word_count(
                    block_source.blocks_dataframe(
                        spark, infos, schema, secret, max_partitions=args.partitions
                    )
                )
                > 0
            )
            t["wc_ds"] = time.perf_counter() - s
            s = time.perf_counter()
            cached.count()
            t["count_cached"] = time.perf_counter() - s
            s = time.perf_counter()
            word_count(cached)
            t["wc_cached"] = time.perf_counter() - s
            print(f"iter {it}: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in t.items()))
            if it >= 2:
                for k, v in t.items():
                    phases[k].append(v * 1000)
    finally:
        server.close()
        spark.stop()
    medians = {k: round(statistics.median(v)) for k, v in phases.items() if v}
    print("medians_ms " + json.dumps({**medians, "load_1m": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
