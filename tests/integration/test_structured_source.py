"""Receiver streams read by Structured Streaming on a real local Spark (issue 10)."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import processes
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from processes import kill_session, load_chaos_harness
from pyspark import cloudpickle
from pyspark.sql import functions as F
from queries import start_query

from spark_receivers import GeneratorReceiver, Receiver, StreamingContext
from spark_receivers.errors import AuthenticationError, ConfigError, RpcError
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.transport import EndpointClient

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import tests

SCENARIO = Path(__file__).with_name("structured_crash_scenario.py")
EPOCH_MS = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
EVENT_SCHEMA = pa.schema([("ts", pa.timestamp("ms", tz="UTC")), ("key", pa.string())])


def wait_until(predicate, timeout_s: float, what: str, query=None) -> None:
    """processes.wait_until that fails at once, with its error, if ``query`` fails."""

    def check():
        if query is not None and query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        return predicate()

    processes.wait_until(check, timeout_s, what)


class EventReceiver(Receiver):
    """Stores (ts, key) events as Arrow batches, a chunk every ``pause_s``, then stops."""

    schema = EVENT_SCHEMA

    def __init__(self, events: list[tuple[int, str]], chunk: int, pause_s: float) -> None:
        super().__init__()
        self.events, self.chunk, self.pause_s = events, chunk, pause_s

    def on_start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def on_stop(self) -> None:
        pass  # the thread sees is_stopped()

    def _run(self) -> None:
        for i in range(0, len(self.events), self.chunk):
            part = self.events[i : i + self.chunk]
            ts = pa.array([t for t, _ in part], pa.timestamp("ms", tz="UTC"))
            self.store(pa.record_batch([ts, pa.array([k for _, k in part])], schema=EVENT_SCHEMA))
            if self.is_stopped():
                return
            time.sleep(self.pause_s)


def make_events(n: int, seed: int = 7) -> list[tuple[int, str]]:
    """Events 10 ms apart in event time, shuffled within 1 s (well inside the watermark)."""
    rng = random.Random(seed)
    events = [(EPOCH_MS + 10 * i + rng.randrange(1000), rng.choice("abcde")) for i in range(n)]
    return events


def sink_rows(path: str) -> set[tuple]:
    """(window start in ms, key, count) of every row the file sink committed."""
    rows = set()
    for f in committed_files(path):
        t = pq.read_table(f)
        starts = t.column("window").combine_chunks().field("start")
        starts = starts.cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
        for start, key, count in zip(
            starts, t["key"].to_pylist(), t["count"].to_pylist(), strict=True
        ):
            rows.add((start, key, count))
    return rows


def test_windowed_aggregation_with_a_watermark_equals_the_batch_result(spark, tmp_path):
    events = make_events(3000)
    flush = [(max(t for t, _ in events) + 60_000, "flush")]  # moves the watermark past all
    ssc = StreamingContext(spark, 1000)
    stream = ssc.structured_stream(EventReceiver(events + flush, chunk=250, pause_s=0.3))
    ssc.start()
    query = None
    try:
        counts = (
            stream.read_stream()
            .withWatermark("ts", "5 seconds")
            .groupBy(F.window("ts", "2 seconds"), "key")
            .count()
        )
        # One query per structured stream: its block log forgets what that query commits.
        with pytest.raises(ConfigError, match=r"read_stream\(\) of structured stream \d+ was"):
            stream.read_stream()
        out = str(tmp_path / "out")
        writer = (
            counts.writeStream.outputMode("append")
            .format("parquet")
            .option("path", out)
            .option("checkpointLocation", str(tmp_path / "sql-checkpoint"))
            .trigger(processingTime="500 milliseconds")
        )
        query = start_query(writer.start)
        batch = spark.createDataFrame(
            [(dt.datetime.fromtimestamp(t / 1000, dt.UTC), k) for t, k in events],
            "ts timestamp, key string",
        )
        expected = {
            (int(r.start.timestamp() * 1000), r.key, r["count"])
            for r in batch.groupBy(F.window("ts", "2 seconds"), "key")
            .count()
            .select("window.start", "key", "count")
            .collect()
        }
        assert sum(c for _, _, c in expected) == len(events)
        wait_until(lambda: len(sink_rows(out)) >= len(expected), 150, "every window", query)
        assert sink_rows(out) == expected
        assert query.exception() is None
    finally:
        if query is not None:
            query.stop()
        ssc.stop(graceful=False)


def count_per_key(key, frames, state):
    """applyInPandasWithState's function: the running count of one key."""
    import pandas as pd

    n = state.get[0] if state.exists else 0
    for frame in frames:
        n += len(frame)
    state.update((n,))
    yield pd.DataFrame({"key": [key[0]], "n": [n]})


def test_state_by_key_with_apply_in_pandas_with_state_counts_every_event_once(spark, tmp_path):
    """The Structured route to state by key (docs/receivers.md): Spark's own stateful operator."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    events = make_events(2000, seed=11)
    ssc = StreamingContext(spark, 1000)
    stream = ssc.structured_stream(EventReceiver(events, chunk=250, pause_s=0.2))
    ssc.start()
    latest: dict[str, int] = {}
    lock = threading.Lock()

    def keep(batch_df, batch_id: int) -> None:
        rows = {r["key"]: r["n"] for r in batch_df.collect()}
        with lock:
            latest.update(rows)

    query = None
    try:
        counts = (
            stream.read_stream()
            .groupBy("key")
            .applyInPandasWithState(
                count_per_key, "key string, n long", "n long", "update", GroupStateTimeout.NoTimeout
            )
        )
        writer = (
            counts.writeStream.foreachBatch(keep)
            .outputMode("update")
            .option("checkpointLocation", str(tmp_path / "sql-checkpoint"))
            .trigger(processingTime="500 milliseconds")
        )
        query = start_query(writer.start)
        want = dict(Counter(k for _, k in events))
        wait_until(lambda: dict(latest) == want, 150, "every event counted", query)
        assert query.exception() is None
    finally:
        if query is not None:
            query.stop()
        ssc.stop(graceful=False)


def test_max_records_per_trigger_is_respected_and_every_record_is_read_once(spark):
    total, limit = 6000, 1000
    ssc = StreamingContext(spark, 1000)
    stream = ssc.structured_stream(GeneratorReceiver(rate=6000, total=total))
    ssc.start()
    query = None
    try:
        writer = (
            stream.read_stream(max_records_per_trigger=limit)
            .writeStream.format("memory")
            .queryName("limited")
            .trigger(processingTime="200 milliseconds")
        )
        query = start_query(writer.start)
        count = lambda: spark.sql("SELECT count(*) AS n FROM limited").collect()[0].n  # noqa: E731
        wait_until(lambda: count() >= total, 150, f"{total} records", query)
        query.processAllAvailable()
        rows = spark.sql("SELECT count(*) AS n, count(DISTINCT value) AS d FROM limited").collect()
        assert (rows[0].n, rows[0].d) == (total, total)
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert max(sizes) <= limit
        assert len(sizes) >= total // limit
        assert sum(sizes) == total
    finally:
        if query is not None:
            query.stop()
        ssc.stop(graceful=False)


def test_the_tracker_answers_readers_only_with_valid_requests(spark):
    ssc = StreamingContext(spark, 1000)
    batches = ssc.receiver_stream(GeneratorReceiver(rate=10))
    batches.foreach_batch(lambda df, t: None)
    structured = ssc.structured_stream(GeneratorReceiver(rate=100))
    ssc.start()
    try:
        options = structured.source_options()
        client = EndpointClient(options["tracker"], options["auth_secret"], timeout_s=10)
        sid = structured.stream_id
        described = client.call(m.DescribeStream(str(sid)))
        assert (described["stream_id"], described["name"]) == (sid, structured.receiver.name)
        assert client.call(m.DescribeStream(structured.receiver.name))["stream_id"] == sid
        wait_until(lambda: client.call(m.StreamOffsets(sid))["queued"] >= 5, 60, "5 records")
        end = client.call(m.AllocateOffsets(sid, 0, 5))
        assert end == 5
        slices = client.call(m.GetOffsetRange(sid, 0, 5))  # one block or several small ones
        assert [info["stream_id"] for info, _, _ in slices] == [sid] * len(slices)
        assert slices[0][1] == 0 and sum(rows for _, _, rows in slices) == 5
        assert client.call(m.CommitOffsets(sid, 5)) is True
        bad = [
            (m.DescribeStream("nope"), "no stream 'nope'"),
            (m.DescribeStream(str(batches.stream_id)), "feeds DStream batches"),
            (m.AllocateOffsets(batches.stream_id, 0, -1), "not read through offsets"),
            (m.AllocateOffsets(sid, -1, -1), "start must be >= 0"),
            (m.AllocateOffsets(sid, 0, -1), "committed and cleaned up already"),
            (m.GetOffsetRange(sid, 5, 10**9), "past the end of the log"),
            (m.CommitOffsets(99, 1), "unknown stream id 99"),
        ]
        for message, error in bad:
            with pytest.raises(RpcError, match=error):
                client.call(message)
        client.close()
        stranger = EndpointClient(options["tracker"], new_secret(), timeout_s=10)
        with pytest.raises(AuthenticationError):
            stranger.call(m.StreamOffsets(sid))
        stranger.close()
    finally:
        ssc.stop(graceful=False)


# --- exactly-once across a driver crash ---------------------------------------------------------


def committed_files(sink: str) -> list[str]:
    """The data files of a file sink's committed batches (its ``_spark_metadata`` log)."""
    meta = os.path.join(sink, "_spark_metadata")
    if not os.path.isdir(meta):
        return []
    names = [n for n in os.listdir(meta) if n.split(".")[0].isdigit() and not n.endswith(".tmp")]
    compacts = [int(n.split(".")[0]) for n in names if n.endswith(".compact")]
    since = max(compacts, default=-1)
    logs = [f"{since}.compact"] if since >= 0 else []
    logs += sorted((n for n in names if n.isdigit() and int(n) > since), key=int)
    files = []
    for name in logs:
        with open(os.path.join(meta, name)) as f:
            for line in f.read().splitlines()[1:]:  # the first line is the version
                entry = json.loads(line)
                if entry.get("action", "add") == "add":
                    files.append(entry["path"].removeprefix("file://"))
    return files


def sink_counts(sink: str) -> Counter:
    counts: Counter = Counter()
    for path in committed_files(sink):
        counts.update(pq.read_table(path).column("seq").to_pylist())
    return counts


def running_counts(sink: str) -> dict[int, list[int]]:
    """Per key, the running counts the stateful query gave its records, in sink order."""
    by_key: dict[int, list[int]] = {}
    for path in committed_files(sink):
        t = pq.read_table(path, columns=["key", "n"])
        for key, n in zip(t["key"].to_pylist(), t["n"].to_pylist(), strict=True):
            by_key.setdefault(key, []).append(n)
    return by_key


def every_seq_in(counts: Counter, n: int) -> bool:
    """Every seq below ``n`` is in ``counts`` (the sink is read once by the caller)."""
    return all(counts[s] for s in range(n))


def batch_ids(directory: Path) -> list[int]:
    return [int(n) for n in os.listdir(directory) if n.isdigit()]


@pytest.mark.timeout(900)  # above the sum of its waits, so a wait says what failed
def test_kill_9_of_the_driver_mid_trigger_keeps_the_sink_and_the_state_exactly_once(tmp_path):
    """A stateful query (applyInPandasWithState, structured_crash_scenario.py) over a receiver
    stream into a file sink, its driver killed -9 in the middle of a trigger."""
    source = load_chaos_harness().AckingSource(rate=500)
    sink, marks = str(tmp_path / "sink"), tmp_path / "marks"
    marks.mkdir()
    cmd = [sys.executable, str(SCENARIO), "--checkpoint", str(tmp_path / "ckpt")]
    cmd += ["--sql-checkpoint", str(tmp_path / "sql"), "--sink", sink, "--marks", str(marks)]
    cmd += ["--port", str(source.port)]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    logs = [open(tmp_path / f"driver{i}.log", "w+") for i in (1, 2)]  # noqa: SIM115
    procs: list[subprocess.Popen] = []

    def start(i: int, slow_ms: int) -> subprocess.Popen:
        p = subprocess.Popen(
            [*cmd, "--slow-ms", str(slow_ms)],
            stdout=logs[i],
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        procs.append(p)
        return p

    def log_text(i: int) -> str:
        logs[i].flush()
        return Path(logs[i].name).read_text()

    def wait_for_driver(i: int, predicate, timeout_s: float, what: str) -> None:
        # On a timeout, say what the driver last printed (its STATUS lines).
        try:
            wait_until(predicate, timeout_s, what)
        except AssertionError as e:
            lines = [ln for ln in log_text(i).splitlines() if "JAVA_TOOL_OPTIONS" not in ln]
            raise AssertionError(f"{e}; driver {i + 1} printed:\n" + "\n".join(lines[-15:])) from e

    try:
        first = start(0, slow_ms=1500)
        wait_for_driver(
            0, lambda: len(sink_counts(sink)) > 0, 180, "a committed trigger with records"
        )
        seen = set(os.listdir(marks))
        wait_until(lambda: set(os.listdir(marks)) - seen, 60, "a trigger in progress")
        kill_session(first)  # its tasks are lingering: the trigger has not committed
        assert first.returncode == -signal.SIGKILL
        before = sink_counts(sink)
        planned, committed = (batch_ids(tmp_path / "sql" / d) for d in ("offsets", "commits"))
        assert max(planned) > max(committed, default=-1), "the kill did not land mid-trigger"

        second = start(1, slow_ms=0)
        wait_for_driver(1, lambda: "RECOVERED" in log_text(1), 150, "the recovered driver")
        total = source.finish()
        wait_for_driver(
            1,
            lambda: source.wait_for(lambda: source.committed >= total, 0.5),
            150,
            f"every record acked ({total} sent)",
        )
        acked = source.committed
        wait_for_driver(
            1,
            lambda: every_seq_in(sink_counts(sink), acked),
            150,
            f"every acknowledged record ({acked}) in the sink",
        )
        second.send_signal(signal.SIGTERM)
        second.wait(90)
        assert second.returncode == 0, log_text(1)[-3000:]
        assert "STOPPED" in log_text(1)

        counts = sink_counts(sink)
        assert sum(before.values()) < sum(counts.values())
        assert [s for s in range(acked) if counts[s] == 0] == []
        twice = [s for s, c in counts.items() if c > 1 and source.send_counts[s] <= 1]
        assert twice == [], f"records sent once but in the sink twice: {twice[:10]}"
        # The state counted each record once: per key the running counts are 1, 2, ... N
        # with no gap (a lost update) and no repeat (a trigger's update applied twice).
        by_key = running_counts(sink)
        assert sorted(by_key) == list(range(7))
        assert sum(len(ns) for ns in by_key.values()) == sum(counts.values())
        for key, ns in by_key.items():
            assert sorted(ns) == list(range(1, len(ns) + 1)), key
    finally:
        for p in procs:
            if p.poll() is None:
                kill_session(p)
        source.close()
        for f in logs:
            f.close()
