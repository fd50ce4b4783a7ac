"""``spark-receivers ingest`` end to end on what issue 36 found: how a run ends, what it says.

Each test runs the command a user runs (its own local Spark, a child process) against
the real server started by scripts/services.sh and fed by its real client.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receivers"))

from ingest_run import IngestRun
from service_fixtures import redis_url  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

WITH_RECORDS = re.compile(r"^batch \S+\s+in\s+[1-9]", re.MULTILINE)
"""A progress line (``--progress lines``) of a batch with records."""


def redis_cli(url: str, *args: str, data: bytes | None = None) -> str:
    port = url.rsplit(":", 1)[1].split("/")[0]
    done = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", port, *args],
        input=data,
        capture_output=True,
        timeout=30,
        check=True,
    )
    return done.stdout.decode().strip()


def test_a_bad_record_under_fail_ends_the_run_at_the_first_one(tmp_path, redis_url):  # noqa: F811
    """bad_record_policy=fail ends the run at the first bad record, not once the restart
    policy gave up on a receiver relaunched onto the same record again and again."""
    stream = f"fail-{uuid.uuid4().hex[:8]}"
    for i in range(5):
        redis_cli(redis_url, "XADD", stream, "*", "value", f"good {i}")
    bad_id = redis_cli(redis_url, "-x", "XADD", stream, "*", "value", data=b"x\xff")
    redis_cli(redis_url, "XADD", stream, "*", "value", "after")
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    run = IngestRun(
        [
            "--no-ui",
            *("--source", f"redis://127.0.0.1:{port}/{stream}?group=g&bad_record_policy=fail"),
            *("--sink", f"parquet:{tmp_path / 'out'}", "--progress", "lines"),
        ],
        tmp_path / "ingest.log",
    )
    try:
        code = run.wait(600)  # no --seconds: only the bad record ends it
    finally:
        run.stop()
    assert code == 1, run.text()[-3000:]
    last = run.last_line()
    assert last == (
        "error: the stream failed: BadRecordError: receiver 0 (RedisStreamReceiver-0) stopped "
        "for good (bad_record_policy=fail) and is not restarted: bad record: entry "
        f"{bad_id} of stream '{stream}': field 'value' is not UTF-8 (byte 1)"
    ), run.text()[-3000:]
    # What was stored (and XACKed) before it was processed: nothing acknowledged is lost.
    assert "done: " in run.text() and ", 5 records processed, 5 received" in run.text()
    # Read once: no relaunched receiver read it again (the entry stays pending, for the user).
    pending = redis_cli(redis_url, "XPENDING", stream, "g", "-", "+", "10").split("\n")
    assert pending[0] == bad_id and pending[-1] == "1", pending  # id ... times delivered
    assert "is not restarted again" not in run.text()  # the restart policy never had to


def test_local_mode_says_once_as_information_that_blocks_are_kept_once(tmp_path):
    """One executor can exist locally: its blocks' one copy is not a degraded level."""
    run = IngestRun(
        [
            "--no-ui",
            *("--source", "generator://?rate=500", "--sink", "console", "--progress", "lines"),
        ],
        tmp_path / "ingest.log",
        env={"SPARK_RECEIVERS_LOG_LEVEL": "INFO"},
    )
    try:
        # Several batches with records, so many blocks: enough to say it twice. Waited for,
        # not timed: a fixed --seconds could end before the receiver started on a slow host.
        run.wait_for(
            lambda text: len(WITH_RECORDS.findall(text)) >= 3, 300, "three batches with records"
        )
        run.interrupt()
        code = run.wait(300)
    finally:
        run.stop()
    text = run.text()
    assert code == 0, text[-3000:]
    assert text.count("local mode has one executor: receivers keep 1 copy") == 1, text[-3000:]
    assert "INFO spark_receivers.receiver.block_placement: local mode has one" in text
    assert "instead of 2" not in text
