"""What ``ingest`` shows while it runs: --progress modes, the live view, the status page flags.

No Spark: the views are fed real listener events and status snapshots. The run itself
(``ingest --progress json`` with the status page on) is in ``tests/test_ingest.py``.
"""

from __future__ import annotations

import io
import json
import os
import sys

import pytest
from rich.console import Console

from spark_receivers.cli.ingest import progress_mode
from spark_receivers.cli.live_view import JsonProgress, LiveView, size, view_owns_the_terminal
from spark_receivers.cli.sinks import parse_sink
from spark_receivers.cli.spark_session import spark_settings, without_unavailable_status_page
from spark_receivers.driver.observe.listener import BatchInfo, OutputOperationInfo, StreamInputInfo
from spark_receivers.driver.observe.progress import ProgressRecorder
from spark_receivers.driver.observe.receiver_metrics import ReceiverMetricsInfo
from spark_receivers.driver.observe.status import ReceiverStatus, StreamingStatus
from spark_receivers.errors import ConfigError

T = 1_764_000_000_000


def status() -> StreamingStatus:
    metrics = ReceiverMetricsInfo(0, "driver", reports=3, input_rate=1234.0, bytes=10_000,
                                  store_memory_bytes=3 * 1024 * 1024, throttled_s=2.5)  # fmt: skip
    r = ReceiverStatus(0, "SocketTextReceiver-0", "ACTIVE", "driver", "127.0.0.1", "e", 5000, 9, 1,
                       metrics=metrics)  # fmt: skip
    return StreamingStatus("ACTIVE", 1000, (r,), batches_completed=2, records_received=5000)


def batch(failed: bool = False) -> BatchInfo:
    op = OutputOperationInfo(T, 0, "write", "write", T + 5, T + 205, "x" if failed else None)
    return BatchInfo(T, {0: 800}, T, T + 5, T + 205, {0: op}, {0: StreamInputInfo(0, 800, 4)})


@pytest.fixture
def terminal():
    """Both ends of a real pseudo-terminal, as files."""
    main_fd, sub_fd = os.openpty()
    out = os.fdopen(sub_fd, "w")
    yield out
    out.close()
    os.close(main_fd)


def test_auto_is_live_on_a_terminal_and_lines_otherwise(terminal):
    parquet, console = parse_sink("parquet:/tmp/out", []), parse_sink("console", [])
    assert progress_mode("auto", parquet, terminal, terminal) == "live"
    assert progress_mode("auto", parquet, io.StringIO(), terminal) == "lines"
    assert progress_mode("auto", console, terminal, terminal) == "lines"  # it prints there
    assert progress_mode("lines", parquet, terminal, terminal) == "lines"
    assert progress_mode("json", parquet, io.StringIO(), io.StringIO()) == "json"
    with pytest.raises(ConfigError, match="--progress json prints to stdout"):
        progress_mode("json", console)


def test_the_status_page_is_on_unless_no_ui():
    assert spark_settings("x", "local[2]", []).conf_dict["spark.receivers.ui.enabled"] == "true"
    off = spark_settings("x", "local[2]", [], ui=False).conf_dict
    assert off["spark.receivers.ui.enabled"] == off["spark.ui.enabled"] == "false"
    kept = spark_settings("x", "local[2]", ["spark.receivers.ui.enabled=false"]).conf_dict
    assert kept["spark.receivers.ui.enabled"] == "false"
    with pytest.raises(ConfigError, match=r"--no-ui and --conf spark\.receivers\.ui\.enabled"):
        spark_settings("x", "local[2]", ["spark.receivers.ui.enabled=true"], ui=False)


def test_without_aiohttp_the_commands_run_without_the_status_page(monkeypatch):
    settings = spark_settings("x", "local[2]", [])
    assert without_unavailable_status_page(settings) == (settings, "")
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # what Python does for a missing module
    changed, warning = without_unavailable_status_page(settings)
    assert changed.conf_dict["spark.receivers.ui.enabled"] == "false"
    assert "the status page needs the aiohttp package" in warning and "running without" in warning
    off = spark_settings("x", "local[2]", [], ui=False)
    assert without_unavailable_status_page(off) == (off, "")  # nothing to say when it is off


def test_json_progress_prints_one_progress_per_batch_on_stdout():
    out, err = io.StringIO(), io.StringIO()
    printer = JsonProgress(1000, status, out=out, err=err)
    recorder = ProgressRecorder(1000, dict)
    for info in (batch(), batch(failed=True)):
        printer.on_batch_completed(info)
        printer.on_batch_progress(recorder.progress_of(info))
    lines = out.getvalue().splitlines()
    assert [json.loads(x)["numInputRows"] for x in lines] == [800, 800]
    assert json.loads(lines[1])["failed"] is True
    assert "FAILED" in err.getvalue() and "numInputRows" not in err.getvalue()
    assert printer.counts()["batches"] == 1 and printer.counts()["failed_batches"] == 1


def test_the_live_view_shows_totals_rates_delays_and_receivers():
    console = Console(record=True, width=160, file=io.StringIO(), force_terminal=True)
    view = LiveView(1000, status, "generator://?rate=1000 -> parquet:/out", console=console)
    view.url = "http://127.0.0.1:4050/"
    recorder = ProgressRecorder(1000, dict)
    for _ in range(3):
        info = batch()
        view.on_batch_completed(info)
        view.on_batch_progress(recorder.progress_of(info))
    console.print(view.render())
    text = console.export_text()
    assert "generator://?rate=1000 -> parquet:/out" in text
    assert "status page http://127.0.0.1:4050/" in text and "4050/metrics" in text
    assert "received 5,000" in text and "processed 2,400" in text and "batches 3" in text
    assert "input 800 rec/s (avg 800, max 800)" in text
    assert "processing 200 ms" in text and "scheduling delay 5 ms" in text
    row = next(line for line in text.splitlines() if "SocketTextReceiver-0" in line)
    for cell in ("ACTIVE", "driver", "1,234", "unlimited", "3.0 MiB", "2.5 s"):
        assert cell in row, (cell, row)
    assert size(512) == "512 B" and size(1536) == "1.5 KiB"


def test_while_the_view_draws_other_writers_to_descriptor_2_go_to_a_log(capfd):
    with view_owns_the_terminal(True) as path:
        assert path is not None
        os.write(2, b"26/11/24 WARN from the JVM or a worker\n")  # behind rich's back
        print("the command's own line", file=sys.stderr)
    os.write(2, b"after the view\n")
    _, err = capfd.readouterr()
    assert "the command's own line" in err and "after the view" in err
    assert "from the JVM" not in err
    with open(path) as f:
        assert f.read() == "26/11/24 WARN from the JVM or a worker\n"
    os.unlink(path)
    with view_owns_the_terminal(False) as none:  # lines and json modes change nothing
        assert none is None
