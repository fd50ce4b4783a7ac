"""How a batch's blocks become read tasks (pure logic; reads are tested end to end)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_receivers.spark.block_source import (
    SNAP_SHARE,
    BlockRead,
    batch_alias,
    split_rows,
)


def blocks(*sizes: int) -> list[dict]:
    return [{"block_id": f"input-0-1-{i}", "num_records": n} for i, n in enumerate(sizes)]


def pieces(runs):
    return [[(b["block_id"][-1], first, end) for b, first, end in run] for run in runs]


def test_five_blocks_in_two_runs_are_cut_in_the_middle_block():
    # Whole blocks gave three against two: the batch waited for the larger run.
    assert pieces(split_rows(blocks(100, 100, 100, 100, 100), 2)) == [
        [("0", 0, None), ("1", 0, None), ("2", 0, 50)],
        [("2", 50, None), ("3", 0, None), ("4", 0, None)],
    ]


def test_one_big_block_is_read_by_every_task():
    assert pieces(split_rows(blocks(900), 3)) == [
        [("0", 0, 300)],
        [("0", 300, 600)],
        [("0", 600, None)],
    ]


def test_a_cut_near_a_block_edge_goes_to_the_edge():
    # The share is 1,000 rows; a cut 10 rows into block 1 would fetch it for a sliver.
    assert pieces(split_rows(blocks(990, 1010), 2)) == [[("0", 0, None)], [("1", 0, None)]]


def test_empty_blocks_ride_along_and_no_rows_make_one_run():
    assert pieces(split_rows(blocks(0, 0), 8)) == [[("0", 0, None), ("1", 0, None)]]
    assert pieces(split_rows(blocks(0, 10, 0), 2)) == [
        [("0", 0, None), ("1", 0, 5)],
        [("1", 5, None), ("2", 0, None)],
    ]


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=60), st.integers(1, 16))
def test_split_rows_reads_every_row_once_in_order_in_equal_runs(sizes, parts):
    bs = blocks(*sizes)
    runs = split_rows(bs, parts)
    assert all(runs)
    read = [
        (b["block_id"], row)
        for run in runs
        for b, first, end in run
        for row in range(first, b["num_records"] if end is None else end)
    ]
    assert read == [(b["block_id"], row) for b in bs for row in range(b["num_records"])]
    counts = [sum((b["num_records"] if e is None else e) - f for b, f, e in r) for r in runs]
    n = max(1, min(parts, sum(sizes)))
    assert len(runs) == n
    # Each cut is exact or moved to a block's edge by at most the slack.
    assert max(counts) - min(counts) <= 4 * (sum(sizes) // n // SNAP_SHARE) + 2


def test_a_structured_streams_slices_are_cut_into_equal_runs():
    from spark_receivers.spark.stream_source import slice_runs

    # Slices of three blocks (the first read from row 40 on) in two tasks: 150 rows each.
    slices = [["b0", 40, 60], ["b1", 0, 100], ["b2", 0, 140]]
    assert slice_runs(slices, 2) == [
        [["b0", 40, 60], ["b1", 0, 90]],
        [["b1", 90, 10], ["b2", 0, 140]],
    ]
    assert slice_runs(slices, 2) == slice_runs(slices, 2)  # the same on every call
    assert slice_runs(slices, 1) == [slices]


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
        runs = split_rows([asdict(i) for i in infos], 2)
        assert [[b["block_id"] for b, _, _ in run] for run in runs] == [
            ["input-0-0-0", "input-0-0-1"],
            ["input-0-0-2"],
        ]
        schema = StructType([StructField("value", StringType())])

        def task(i: int) -> list[pa.RecordBatch]:
            return [pa.record_batch([pa.array([i], pa.int64())], names=["id"])]

        def rows(read: BlockRead, i: int) -> list[str]:
            return [v for b in read(iter(task(i))) for v in b.column(0).to_pylist()]

        read = BlockRead(runs, schema, secret, None, "fail", None, None)
        assert rows(read, 0) == ["b0-0", "b1-0", "b1-1"]
        assert rows(read, 1) == ["b2-0", "b2-1", "b2-2"]
        # Three tasks: blocks 1 and 2 are cut, each task reads two of the six rows.
        thirds = BlockRead(
            split_rows([asdict(i) for i in infos], 3), schema, secret, None, "fail", None, None
        )
        assert [rows(thirds, i) for i in range(3)] == [
            ["b0-0", "b1-0"],
            ["b1-1", "b2-0"],
            ["b2-1", "b2-2"],
        ]
        wrong = BlockRead(runs, schema, "not the secret", None, "fail", None, None)
        with pytest.raises(Exception, match="input-0-0-2"):
            list(wrong(iter(task(1))))
    finally:
        server.close()


def test_a_lost_block_cut_between_tasks_is_reported_once(monkeypatch):
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.auth import new_secret
    from spark_receivers.rpc.transport import FlightEndpoint
    from spark_receivers.spark import block_fetch

    reported: list[str] = []
    monkeypatch.setattr(
        block_fetch, "report_lost_block", lambda _t, _s, info, *_: reported.append(info.block_id)
    )
    secret = new_secret()
    served = {"input-0-0-1": pa.table({"value": ["kept"] * 4})}
    server = FlightEndpoint(
        "test-blocks", "127.0.0.1", secret, (), lambda _: None, lambda t: served[t.decode()]
    )
    try:
        infos = [m.ReceivedBlockInfo(0, f"input-0-0-{i}", 4, 0, server.address) for i in range(2)]
        runs = split_rows([asdict(i) for i in infos], 4)  # block 0 (lost) is cut in two
        schema = StructType([StructField("value", StringType())])
        read = BlockRead(runs, schema, secret, None, "skip", "tracker", None)
        task = [pa.record_batch([pa.array(range(4), pa.int64())], names=["id"])]
        assert [v for b in read(iter(task)) for v in b.column(0).to_pylist()] == ["kept"] * 4
        assert reported == ["input-0-0-0"]
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
