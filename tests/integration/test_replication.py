"""Replicated blocks on a real cluster with the WAL off (issue 18): nothing accepted is lost.

The scenario (replication_scenario.py) runs in a process of its own; see its doc. Both
runs (the default level and the one-copy control) use the session's standalone cluster:
workers on hosts of their own (127.0.0.2, .3), so a block's copy crosses "hosts", and the
cluster is up already (a local-cluster would start three more JVMs per run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]  # a scenario runs in ~1 min here


def run_scenario(*args: str) -> dict:
    script = Path(__file__).with_name("replication_scenario.py")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=840, env=env
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"scenario failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def replicated(standalone) -> dict:
    """The default level (MEMORY_AND_DISK_2) on the standalone cluster, run once."""
    return run_scenario("--master", standalone.master_url)


def test_blocks_are_on_two_executors_before_the_driver_hears_of_them(replicated):
    assert replicated["placed"]
    assert replicated["executors"]["0"] != replicated["executors"]["1"]
    assert replicated["copies_before"] == {"0": [2, 2], "1": [2, 2]}


def test_an_executor_killed_loses_no_accepted_record_and_its_receiver_moves(replicated):
    # The kill hit blocks accepted and not yet read; they were read after its keeper went.
    assert replicated["unread_at_executor_kill"] > 0 and replicated["keeper_gone"]
    assert replicated["receiver_0_moved"]
    assert replicated["receiver_0_executor_after"] != replicated["killed_executor"]
    assert replicated["failure_before_stop"] is None and replicated["failure"] is None
    assert replicated["state_before_stop"] == "ACTIVE"
    assert replicated["blocks_lost"] == 0
    assert not [e for e in replicated["events"] if e[0] == "lost"]
    # Exactly once: everything the driver accepted was processed, and nothing twice.
    assert replicated["processed"] == replicated["records_received_at_end"]
    assert replicated["processed"] == replicated["records_processed_at_end"]
    assert replicated["duplicated"] == 0
    assert replicated["accepted_before_executor_kill"] < replicated["processed"]


def test_losing_a_copy_degrades_visibly_and_a_new_executor_restores_it(replicated):
    kinds = [tuple(e) for e in replicated["events"] if e[0] == "replication"]
    assert ("replication", 1, 1, 2) in kinds  # its replica's executor died
    degraded_at = kinds.index(("replication", 1, 1, 2))
    assert ("replication", 1, 2, 2) in kinds[degraded_at + 1 :]  # and came back
    assert replicated["replicated_again"]


def test_a_receiver_worker_killed_loses_nothing(replicated):
    assert replicated["receiver_1_restarted"]
    assert replicated["accepted_before_worker_kill"] < replicated["processed"]


def test_the_keepers_end_with_the_context(replicated):
    assert replicated["keepers_before_stop"] == 2
    assert replicated["keepers_alive_after_stop"] == []


def test_one_copy_loses_blocks_with_its_executor_and_skip_reports_them(standalone):
    """The control: MEMORY_AND_DISK keeps one copy; lostBlockPolicy=skip runs on without it."""
    single = run_scenario(
        "--master",
        standalone.master_url,
        "--level",
        "MEMORY_AND_DISK",
        "--lost-block-policy",
        "skip",
    )
    assert single["unread_at_executor_kill"] > 0 and single["keeper_gone"]
    assert single["receiver_0_moved"]
    assert single["failure"] is None and single["state_before_stop"] == "ACTIVE"
    # Every record unread at the kill was held by the killed executor's keeper alone.
    assert single["records_lost"] >= single["unread_at_executor_kill"]
    assert single["blocks_lost"] > 0
    lost_events = [e for e in single["events"] if e[0] == "lost"]
    assert len(lost_events) == single["blocks_lost"]
    assert all(e[1] == 0 for e in lost_events)  # only the killed executor's receiver
    assert single["duplicated"] == 0
    assert single["processed"] + single["records_lost"] == single["records_received_at_end"]
    assert single["records_processed_at_end"] == single["processed"]
