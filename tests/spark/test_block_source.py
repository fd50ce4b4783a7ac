"""How a batch's blocks become read tasks (pure logic; reads are tested end to end)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spark_receivers.spark.block_source import BlockPartition, BlockReader, group_blocks


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


def test_reader_partitions_follow_the_option_and_a_warm_up_read_has_empty_ones():
    import json

    options = {"blocks": json.dumps(blocks(5, 5, 5, 5)), "auth_secret": "s", "max_partitions": "2"}
    parts = BlockReader(options).partitions()
    assert [len(p.blocks) for p in parts] == [2, 2]
    assert all(isinstance(p, BlockPartition) for p in parts)
    warm = BlockReader({"blocks": "[]", "auth_secret": "", "max_partitions": "3"}).partitions()
    assert [p.blocks for p in warm] == [[], [], []]


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
