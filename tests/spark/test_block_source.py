"""How a batch's blocks become read tasks (pure logic; reads are tested end to end)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_receivers.spark.block_source import BlockRead, batch_alias, group_blocks


def blocks(*sizes: int) -> list[dict]:
    return [{"block_id": f"input-0-1-{i}", "num_records": n} for i, n in enumerate(sizes)]


def test_blocks_are_split_into_runs_of_similar_record_counts():
    groups = group_blocks(blocks(100, 100, 100, 100, 100, 100), 3)
    assert [[b["num_records"] for b in g] for g in groups] == [[100, 100]] * 3


def test_a_big_block_gets_a_run_of_its_own():
    groups = group_blocks(blocks(1000, 10, 10, 10), 2)
    assert [len(g) for g in groups] == [1, 3]


def test_never_more_runs_than_blocks_and_empty_blocks_count():
    assert [len(g) for g in group_blocks(blocks(0, 0), 8)] == [1, 1]


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=60), st.integers(1, 16))
def test_runs_keep_every_block_once_in_order(sizes, max_partitions):
    bs = blocks(*sizes)
    groups = group_blocks(bs, max_partitions)
    assert [b for g in groups for b in g] == bs
    assert all(groups)
    assert len(groups) == min(len(bs), max_partitions)


def test_task_i_reads_run_i_of_the_batch_block_after_block():
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.auth import new_secret
    from spark_receivers.rpc.transport import FlightEndpoint

    served = {
        f"input-0-0-{i}": pa.table({"value": [f"b{i}-{j}" for j in range(i + 1)]}) for i in range(3)
    }
    secret = new_secret()
    server = FlightEndpoint(
        "test-blocks", "127.0.0.1", secret, (), lambda _: None, lambda t: served[t.decode()]
    )
    try:
        infos = [
            m.ReceivedBlockInfo(0, name, t.num_rows, 0, server.address)
            for name, t in served.items()
        ]
        groups = group_blocks([asdict(i) for i in infos], 2)
        assert [[b["block_id"] for b in g] for g in groups] == [
            ["input-0-0-0", "input-0-0-1"],
            ["input-0-0-2"],
        ]
        schema = StructType([StructField("value", StringType())])
        read = BlockRead(groups, schema, secret, None, "fail", None, None)

        def task(i: int) -> list[pa.RecordBatch]:
            return [pa.record_batch([pa.array([i], pa.int64())], names=["id"])]

        def rows(i: int) -> list[str]:
            return [v for b in read(iter(task(i))) for v in b.column(0).to_pylist()]

        assert rows(0) == ["b0-0", "b1-0", "b1-1"]
        assert rows(1) == ["b2-0", "b2-1", "b2-2"]
        wrong = BlockRead(groups, schema, "not the secret", None, "fail", None, None)
        with pytest.raises(Exception, match="input-0-0-2"):
            list(wrong(iter(task(1))))
    finally:
        server.close()


def test_a_batch_alias_names_stream_and_time():
    assert batch_alias("3:1795830627000") == "spark_receivers_batch_3_1795830627000"


def test_blocks_are_cast_to_the_arrow_types_spark_expects():
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    from spark_receivers.spark.block_source import arrow_schema_of, conform

    spark_schema = StructType(
        [StructField("ts", TimestampType()), StructField("key", StringType())]
    )
    block = pa.table(
        {"ts": pa.array([1_000, 2_000], pa.timestamp("ms", tz="UTC")), "key": ["a", "b"]}
    )
    expected = arrow_schema_of(spark_schema)
    assert expected.field("ts").type == pa.timestamp("us", tz="UTC")
    cast = conform(block, expected)
    assert cast.schema.equals(expected)
    assert cast.column("ts").cast(pa.int64()).to_pylist() == [1_000_000, 2_000_000]
    assert conform(cast, expected) is cast  # nothing to do
