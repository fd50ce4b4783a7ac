"""What a run does without Spark: settings, durations, plan, preflight, outcome, progress."""

from __future__ import annotations

import io
import socket

import pytest

from spark_receivers.cli.app import build_parser
from spark_receivers.cli.ingest import parse_interval_ms, parse_seconds, plan_ingest, preflight
from spark_receivers.cli.outcome import judge
from spark_receivers.cli.progress import ProgressPrinter, one_line, reason_of
from spark_receivers.cli.spark_session import spark_settings
from spark_receivers.context import StreamingError
from spark_receivers.driver.observe.listener import BatchInfo, OutputOperationInfo, ReceiverInfo
from spark_receivers.driver.observe.status import ReceiverStatus, StreamingStatus
from spark_receivers.errors import ConfigError


def ingest_args(*argv: str):
    return build_parser().parse_args(["ingest", *argv])


# --- durations --------------------------------------------------------------------------


def test_interval_and_seconds_take_spark_durations():
    assert parse_interval_ms("1s", None) == 1000
    assert parse_interval_ms("500ms", None) == 500
    assert parse_interval_ms("1min", None) == 60_000
    assert parse_interval_ms("250", None) == 250  # a bare number is ms
    assert parse_interval_ms(None, None) == 1000
    assert parse_seconds("30") == 30.0
    assert parse_seconds("2min") == 120.0
    assert parse_seconds("1.5s") == 1.5
    assert parse_seconds(None) is None


def test_the_deprecated_interval_flag_still_works(capsys):
    assert parse_interval_ms(None, 1500) == 1500
    assert (
        "--batch-interval-ms is deprecated: use --batch-interval 1500ms" in capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match="not both"):
        parse_interval_ms("1s", 1000)


@pytest.mark.parametrize("raw", ["-1", "inf", "-inf", "nan", "NaN", "Infinity", "0", "0s", "soon"])
def test_seconds_refuses_what_is_not_a_finite_positive_duration(raw):
    with pytest.raises(ConfigError, match="--seconds must be"):
        parse_seconds(raw)


@pytest.mark.parametrize("raw", ["0", "0.1ms", "-1s", "1 fortnight", "inf"])
def test_interval_refuses_nonsense(raw):
    with pytest.raises(ConfigError, match="--batch-interval must"):
        parse_interval_ms(raw, None)


# --- Spark settings ----------------------------------------------------------------------


def test_settings_resolve_the_master_and_keep_the_ui_on():
    s = spark_settings("app", None, [], environ={})
    assert s.master == "local[4]"
    assert s.conf_dict["spark.ui.enabled"] == "true"
    assert s.conf_dict["spark.submit.deployMode"] == "client"
    s = spark_settings("app", None, ["spark.master=spark://m:7077", "a.b=c=d"], environ={})
    assert (s.master, s.conf_dict["a.b"]) == ("spark://m:7077", "c=d")
    assert "spark.sql.shuffle.partitions" not in s.conf_dict  # local defaults only locally
    s = spark_settings("app", "local[3]", ["spark.sql.shuffle.partitions=8"], ui=False, environ={})
    assert s.conf_dict["spark.sql.shuffle.partitions"] == "8"
    assert s.conf_dict["spark.ui.enabled"] == "false"


def test_a_local_master_forks_its_workers_from_our_daemon_unless_told_otherwise():
    key = "spark.python.daemon.module"
    local = spark_settings("app", "local[2]", [], environ={})
    assert local.conf_dict[key] == "spark_receivers.spark.worker_daemon"
    own = spark_settings("app", "local[2]", [f"{key}=pyspark.daemon"], environ={})
    assert own.conf_dict[key] == "pyspark.daemon"
    # A cluster's executors may run another Python: the setting stays Spark's there.
    cluster = spark_settings("app", "spark://m:7077", [], environ={})
    assert key not in cluster.conf_dict


def test_settings_read_spark_defaults(tmp_path):
    (tmp_path / "spark-defaults.conf").write_text("# a comment\nspark.master  spark://h:7077\n")
    assert spark_settings("a", None, [], environ={"SPARK_CONF_DIR": str(tmp_path)}).master == (
        "spark://h:7077"
    )
    assert spark_settings(
        "a", "local[2]", [], environ={"SPARK_CONF_DIR": str(tmp_path)}
    ).master == ("local[2]")


@pytest.mark.parametrize(
    ("master", "conf", "kwargs", "message"),
    [
        (None, ["novalue"], {}, "--conf must be KEY=VALUE, got 'novalue'"),
        (None, ["=x"], {}, "--conf must be KEY=VALUE"),
        (None, ["a=1", "a=2"], {}, "--conf a is given twice"),
        ("local[2]", ["spark.master=local[3]"], {}, "disagree"),
        (None, [], {"deploy_mode": "cluster"}, "--deploy-mode cluster is not supported"),
        (None, ["spark.submit.deployMode=cluster"], {}, "must be client"),
        (None, ["spark.ui.enabled=true"], {"ui": False}, "--no-ui and --conf"),
    ],
)
def test_bad_spark_settings(master, conf, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        spark_settings("a", master, conf, environ={}, **kwargs)


# --- the plan -----------------------------------------------------------------------------


def test_plan_reads_wal_and_checkpoint_from_conf_too(tmp_path):
    plan = plan_ingest(
        ingest_args(
            "--source",
            "generator://",
            "--sink",
            "console",
            "--conf",
            "spark.streaming.receiver.writeAheadLog.enable=true",
            "--conf",
            f"spark.receivers.checkpointDir={tmp_path}",
        )
    )
    assert (plan.wal, plan.wal_flag, plan.checkpoint) == (True, False, str(tmp_path))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--wal"], "--wal needs --checkpoint DIR"),
        (["--conf", "spark.streaming.receiver.writeAheadLog.enable=true"], "--wal needs"),
        (["--conf", "spark.streaming.blockInterval=soon"], "spark.streaming.blockInterval must"),
        (["--master", "local[1]"], "has 1 core\\(s\\) but 1 receiver"),
        (["--master", "local"], "has 1 core\\(s\\) but 1 receiver"),
    ],
)
def test_plan_refuses_before_spark(argv, message):
    with pytest.raises(ConfigError, match=message):
        plan_ingest(ingest_args("--source", "generator://", "--sink", "console", *argv))


def test_a_checkpoint_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        plan_ingest(
            ingest_args(
                "--source", "generator://", "--sink", "console", "--checkpoint", str(tmp_path / "f")
            )
        )


# --- preflight (local checks) --------------------------------------------------------------


def test_an_http_port_in_use_is_refused_before_spark():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        plan = plan_ingest(
            ingest_args("--source", f"http://127.0.0.1:{port}/x?token=s3cret", "--sink", "console")
        )
        with pytest.raises(ConfigError) as e:
            preflight(plan)
    assert f"cannot listen on 127.0.0.1:{port}" in str(e.value)
    assert "another process holds the port" in str(e.value)
    assert "s3cret" not in str(e.value)


def test_an_http_host_of_another_machine_is_refused():
    plan = plan_ingest(ingest_args("--source", "http://192.0.2.77:8090/x", "--sink", "console"))
    with pytest.raises(ConfigError, match="is not an address of this machine"):
        preflight(plan)


def test_the_http_check_is_local_only():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        plan = plan_ingest(
            ingest_args(
                "--source",
                f"http://127.0.0.1:{port}/x",
                "--sink",
                "console",
                "--master",
                "spark://m:7077",
            )
        )
        preflight(plan)  # on a cluster the port is an executor's


def test_a_missing_file_directory_is_refused(tmp_path):
    plan = plan_ingest(ingest_args("--source", f"file://{tmp_path}/nope", "--sink", "console"))
    with pytest.raises(ConfigError, match="does not exist; create the directory first"):
        preflight(plan)


def test_preflight_warns_about_an_unreachable_server_and_a_missing_wal():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        plan = plan_ingest(
            ingest_args("--source", f"redis://127.0.0.1:{port}/s?group=g", "--sink", "console")
        )
        warnings = preflight(plan)
    assert warnings[0].startswith(f"127.0.0.1:{port} cannot be reached now")
    assert warnings[1].startswith("the write-ahead log is off: an XACK only means")


def test_no_wal_warning_with_the_wal_or_for_unreliable_sources(tmp_path):
    plan = plan_ingest(
        ingest_args(
            "--source",
            f"file://{tmp_path}",
            "--sink",
            "console",
            "--checkpoint",
            str(tmp_path / "c"),
            "--wal",
        )
    )
    assert preflight(plan) == []
    assert (
        preflight(plan_ingest(ingest_args("--source", "generator://", "--sink", "console"))) == []
    )


# --- outcome --------------------------------------------------------------------------------


def status(**kw) -> StreamingStatus:
    return StreamingStatus(state="STOPPED", batch_interval_ms=1000, **kw)


def test_a_clean_stop_exits_0():
    out = judge(
        status(records_received=10, records_processed=10, batches_completed=3), {}, None, wal=False
    )
    assert out.code == 0
    assert out.lines == ("done: 3 batches, 10 records processed, 10 received",)


def test_a_failed_stream_exits_1_with_honest_counts():
    counts = {"failed_batches": 1, "failed_records": 740, "submitted": {}}
    out = judge(
        status(records_received=1385, records_processed=645, batches_completed=4),
        counts,
        "org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: file:/o",
        wal=False,
    )
    assert out.code == 1
    assert out.lines[0] == (
        "done: 4 batches, 645 records processed, 1,385 received; 1 batch(es) failed (740 records)"
    )
    assert out.lines[1].startswith("740 received records were not processed and are lost")
    assert out.lines[-1] == (
        "error: the stream failed: org.apache.hadoop.fs.ParentNotDirectoryException: "
        "Parent path is not a directory: file:/o"
    )


def test_with_the_wal_unprocessed_records_wait_in_the_log():
    out = judge(status(records_received=10, records_processed=4), {}, "boom", wal=True)
    assert "they are in the write-ahead log: run the same command again" in out.lines[1]


def test_a_stop_that_leaves_records_unprocessed_exits_1():
    out = judge(status(records_received=10, records_processed=7), {}, None, wal=False)
    assert out.code == 1
    assert out.lines[-1].startswith("error: the stop left 3 received records unprocessed")


def receiver(endpoint: str | None, error: str = "") -> ReceiverStatus:
    return ReceiverStatus(0, "SocketTextReceiver-0", "INACTIVE", None, None, endpoint, 0, 0, 1,
                          last_error_message=error)  # fmt: skip


def test_a_receiver_that_never_started_fails_the_run_with_its_last_error():
    refused = receiver(None, "cannot connect to 127.0.0.1:9: Connection refused")
    out = judge(status(receivers=(refused,)), {}, None, wal=False)
    assert out.code == 1
    assert out.lines[-1] == (
        "error: receiver SocketTextReceiver-0 never started, so nothing was received; its last "
        "error: cannot connect to 127.0.0.1:9: Connection refused. Check the source and the "
        "cluster"
    )
    unscheduled = judge(status(receivers=(receiver(None),)), {}, None, wal=False)
    assert (
        "no executor ran its task within spark.receivers.receiver.startTimeout"
        in (unscheduled.lines[-1])
    )
    # A receiver that started and received nothing (an idle source) is a clean run.
    idle = judge(status(receivers=(receiver("127.0.0.1:4000"),)), {}, None, wal=False)
    assert idle.code == 0


def test_a_receiver_that_started_only_during_the_stop_is_named_but_the_run_is_clean():
    # It registered while the graceful stop waited for it, and was stopped at once: it
    # started, nothing it received was lost, and a status that depended on when the run
    # was stopped would make it a matter of timing; the last line says why nothing came.
    late = receiver("127.0.0.1:4000")
    out = judge(status(receivers=(late,)), {}, None, wal=False, unstarted_at_stop={0})
    assert out.code == 0
    assert out.lines[-1] == (
        "note: receiver SocketTextReceiver-0 started only as the run was stopping, so nothing "
        "was received (its start was slow: a busy machine or executor; a longer run gives it "
        "time)"
    )
    # Records from it (it started during the stop and caught up): no note.
    caught_up = status(receivers=(late,), records_received=5, records_processed=5)
    assert judge(caught_up, {}, None, wal=False, unstarted_at_stop={0}).lines == (
        "done: 0 batches, 5 records processed, 5 received",
    )


def test_a_recovered_run_whose_receiver_never_started_fails_like_any_other():
    # It redid its checkpoint's batches, but received nothing new: its receiver did not
    # start within startTimeout (a graceful stop waits for a receiver still starting, so
    # this is not a matter of when the run was stopped).
    recovered = status(
        receivers=(receiver(None),), records_processed=100, recovered_batches_ms=(1000,)
    )
    out = judge(recovered, {"submitted": {1000: 100}}, None, wal=True)
    assert out.code == 1
    assert out.lines == (
        "done: 0 batches, 100 records processed, 0 received (+100 redone from the checkpoint)",
        "error: receiver SocketTextReceiver-0 never started, so nothing was received; no "
        "executor ran its task within spark.receivers.receiver.startTimeout (are the "
        "executors' task slots all taken?). Check the source and the cluster",
    )


def test_a_recovered_run_counts_what_it_redid():
    counts = {"submitted": {1000: 5, 2000: 3, 3000: 4}}
    out = judge(
        status(records_received=4, records_processed=12, recovered_batches_ms=(1000, 2000)),
        counts,
        None,
        wal=True,
    )
    assert out.code == 0
    assert out.lines == (
        "done: 0 batches, 12 records processed, 4 received (+8 redone from the checkpoint)",
    )


# --- progress ---------------------------------------------------------------------------------

JAVA_TRACEBACK = """Traceback (most recent call last):
  File "/x/job_generator.py", line 205, in _run_batch
    op.run()
py4j.protocol.Py4JJavaError: An error occurred while calling o43.parquet.
: org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: file:/o
\tat org.apache.hadoop.fs.RawLocalFileSystem.mkdirs(RawLocalFileSystem.java:873)
"""


def test_reason_of_a_traceback():
    assert reason_of(JAVA_TRACEBACK) == (
        "org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: file:/o"
    )
    assert reason_of('Traceback:\n  File "x"\nValueError: bad\nvalue\n') == "ValueError: bad"


def test_one_line_unwraps_a_streaming_error():
    try:
        try:
            raise OSError("disk full\nmore details")
        except OSError as e:
            raise StreamingError("the streaming context failed: disk full") from e
    except StreamingError as e:
        assert one_line(e) == "OSError: disk full"
    assert len(one_line(ValueError("x" * 5000))) <= 400


def test_the_printer_counts_only_successful_batches():
    out = io.StringIO()
    printer = ProgressPrinter(1000, lambda: status(), out)
    ok = BatchInfo(1_000, {0: 7}, 1_000, 1_001, 1_050)
    failed_op = OutputOperationInfo(2_000, 0, "parquet:/o", "parquet:/o", 1, 2, JAVA_TRACEBACK)
    failed = BatchInfo(2_000, {0: 5}, 2_000, 2_001, 2_050, {0: failed_op})
    for info in (ok, failed):
        printer.on_batch_submitted(info)
        printer.on_batch_started(info)
        printer.on_batch_completed(info)
    printer.on_batch_started(BatchInfo(3_000, {0: 1}, 3_000, 3_001))
    assert printer.running() == {3_000}  # started, its end not seen
    printer.on_receiver_error(
        ReceiverInfo(0, "HttpReceiver-0", True, None, None, "port busy\ntrace")
    )
    counts = printer.counts()
    assert (counts["batches"], counts["records"]) == (1, 7)
    assert (counts["failed_batches"], counts["failed_records"]) == (1, 5)
    assert counts["submitted"] == {1_000: 7, 2_000: 5}
    lines = out.getvalue().splitlines()
    assert "FAILED, nothing of it counts as processed: org.apache.hadoop.fs.Parent" in lines[1]
    assert lines[2] == "receiver 0 (HttpReceiver-0): port busy"
