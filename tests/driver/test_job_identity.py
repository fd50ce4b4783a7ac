"""The job id a checkpoint keeps: written once, read back wherever the checkpoint is mounted."""

from __future__ import annotations

import pytest

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.job_identity import checkpoint_job_id
from spark_receivers.errors import ConfigError
from spark_receivers.receiver.source_support import durable_name, durable_scope


class Supervisor:
    def __init__(self, config: StreamingConfig, app_id: str = "") -> None:
        self.config = config
        self.app_id = app_id


def test_the_first_start_writes_a_random_id_and_every_later_one_reads_it(tmp_path):
    ck = tmp_path / "ck"
    first = checkpoint_job_id(str(ck))  # the directory need not exist yet
    assert len(first) == 16 and int(first, 16) >= 0
    assert (ck / "job-id").read_text() == first
    assert checkpoint_job_id(str(ck)) == first
    assert checkpoint_job_id(str(ck) + "/") == first
    assert checkpoint_job_id(f"file://{ck}") == first  # the same directory as a URI


def test_the_id_travels_with_the_checkpoint_not_with_its_path(tmp_path):
    path = tmp_path / "mnt"
    path.mkdir()
    a = checkpoint_job_id(str(path))
    path.rename(tmp_path / "moved")
    path.mkdir()
    b = checkpoint_job_id(str(path))  # another volume at the same path: another job
    assert a != b
    assert checkpoint_job_id(str(tmp_path / "moved")) == a  # the first job, moved: itself


def test_a_torn_id_file_is_replaced_by_a_new_id(tmp_path, caplog):
    (tmp_path / "job-id").write_text("")
    new = checkpoint_job_id(str(tmp_path))
    assert len(new) == 16 and (tmp_path / "job-id").read_text() == new
    assert "not a job id: writing a new one" in caplog.text


def test_durable_names_come_from_the_job_id_else_the_application(tmp_path):
    ck = str(tmp_path / "ck")
    with_ck = Supervisor(StreamingConfig(checkpoint_dir=ck, job_id=checkpoint_job_id(ck)), "a-1")
    assert durable_name(with_ck, 2, "p") == f"p-{checkpoint_job_id(ck)}-2"
    assert durable_scope(with_ck) == "job"
    by_hand = Supervisor(StreamingConfig(job_id="orders-eu.1"), "a-1")
    assert (durable_name(by_hand, 0, "p"), durable_scope(by_hand)) == ("p-orders-eu.1-0", "job")
    app = Supervisor(StreamingConfig(), "app-7")
    assert (durable_name(app, 0, "p"), durable_scope(app)) == ("p-app-7-0", "application")
    assert StreamingConfig.from_spark_conf({"spark.receivers.jobId": "x"}).job_id == "x"


@pytest.mark.parametrize("bad", ["a b", "a/b", "x" * 65, "é"])
def test_a_job_id_by_hand_must_fit_in_a_client_id(bad):
    with pytest.raises(ConfigError, match=r"job_id \(spark.receivers.jobId\) must be 1-64 letters"):
        StreamingConfig(job_id=bad)
