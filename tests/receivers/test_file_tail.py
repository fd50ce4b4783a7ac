"""FileTailReceiver on real files: appends, new files, rotation, truncation, restarts."""

from __future__ import annotations

import base64
import json
import os
from datetime import UTC, datetime

import pytest
from harness import HarnessSupervisor
from waiting import wait_until

from spark_receivers.errors import ConfigError
from spark_receivers.receivers import FileTailReceiver

FAST = {"poll_interval_ms": 20, "finish_after_ms": 100}


def append(path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


@pytest.fixture
def tail(tmp_path):
    started: list[HarnessSupervisor] = []

    def tail(**kwargs) -> tuple[FileTailReceiver, HarnessSupervisor]:
        options = {**FAST, **kwargs}
        receiver = FileTailReceiver(str(tmp_path / "logs"), **options)
        sup = HarnessSupervisor(receiver).start()
        started.append(sup)
        return receiver, sup

    (tmp_path / "logs").mkdir()
    yield tail
    for sup in started:
        sup.shutdown()


def test_appended_complete_lines_arrive_and_a_partial_line_waits(tmp_path, tail):
    log = tmp_path / "logs" / "app.log"
    append(log, "one\ntwo\nthr")
    receiver, sup = tail()
    assert sup.wait_for(2) == ["one", "two"]
    append(log, "ee\r\nfour\n")
    assert sup.wait_for(4) == ["one", "two", "three", "four"]
    # every batch was stored reliably before its offset was saved
    assert all(batch for batch in sup.reliable_batches)
    # ... and the saved offset follows right after the store
    size = log.stat().st_size
    assert wait_until(lambda: saved_offsets(receiver) == [size], 5), saved_offsets(receiver)


def test_good_lines_are_stored_as_arrow_each_batch_at_its_offset(tmp_path, tail):
    log = tmp_path / "logs" / "app.log"
    lines = [f"line {i} é" for i in range(5000)]
    append(log, "\n".join(lines) + "\r\nhalf")
    _, sup = tail(max_batch_bytes=20_000, max_record_bytes=100)
    assert sup.wait_for(5000) == lines
    # one Arrow table per reliable store, each with the offset after its last line
    assert sup.tables_stored == len(sup.reliable_batches) == len(sup.positions) > 1
    offsets = [json.loads(p)["offset"] for p in sup.positions]
    data = log.read_bytes()
    assert all(data[o - 1 : o] == b"\n" for o in offsets)
    assert offsets[-1] == len(data) - len(b"half")  # the partial last line waits


def test_new_files_matching_the_pattern_are_followed(tmp_path, tail):
    _, sup = tail(pattern="*.log")
    append(tmp_path / "logs" / "a.log", "a1\n")
    append(tmp_path / "logs" / "ignored.txt", "nope\n")
    append(tmp_path / "logs" / ".hidden.log", "nope\n")
    assert sup.wait_for(1) == ["a1"]
    append(tmp_path / "logs" / "b.log", "b1\nb2\n")
    append(tmp_path / "logs" / "a.log", "a2\n")
    assert sorted(sup.wait_for(4)) == ["a1", "a2", "b1", "b2"]
    assert wait_until(lambda: False, 0.2) is False
    assert "nope" not in sup.records


def test_rotation_finishes_the_old_file_then_reads_the_new_one(tmp_path, tail):
    log = tmp_path / "logs" / "app.log"
    append(log, "old 1\n")
    _, sup = tail(pattern="*.log")
    sup.wait_for(1)
    # the writer appends, the file is rotated away, the writer finishes its last lines
    # through its still-open handle, and a new file takes the name
    with open(log, "a") as writer:
        writer.write("old 2\n")
        writer.flush()
        os.rename(log, tmp_path / "logs" / "app.log.1")
        writer.write("old 3\nold unterminated")
    append(log, "new 1\n")
    records = sup.wait_for(5)
    assert sorted(records) == ["new 1", "old 1", "old 2", "old 3", "old unterminated"]
    assert records.index("old 3") < records.index("old unterminated")
    # the old inode is forgotten once finished; the new one is followed
    assert wait_until(lambda: len(saved_offsets(sup.receiver)) == 1, 5)


def test_deleted_rotated_file_is_finished_through_its_open_handle(tmp_path, tail):
    log = tmp_path / "logs" / "app.log"
    append(log, "a\n")
    _, sup = tail()
    sup.wait_for(1)
    with open(log, "a") as writer:
        os.unlink(log)
        writer.write("b\nc\n")
    assert sup.wait_for(3) == ["a", "b", "c"]


def test_truncation_restarts_at_zero_and_is_reported(tmp_path, tail):
    log = tmp_path / "logs" / "app.log"
    append(log, "first line\nsecond line\n")
    _, sup = tail()
    sup.wait_for(2)
    with open(log, "w") as f:  # copytruncate
        f.write("x\n")
    assert sup.wait_for(3)[-1] == "x"
    errors = sup.wait_for_errors(1)
    assert "truncated" in errors[0]


def test_restart_resumes_after_the_last_stored_line(tmp_path):
    directory = tmp_path / "logs"
    directory.mkdir()
    log = directory / "app.log"
    append(log, "".join(f"line {i}\n" for i in range(100)))
    first = FileTailReceiver(str(directory), **FAST)
    sup = HarnessSupervisor(first).start()
    sup.wait_for(100)
    sup.shutdown()
    append(log, "".join(f"line {i}\n" for i in range(100, 150)))
    # a new receiver object, as after a restart on another executor
    second = FileTailReceiver(str(directory), **FAST)
    sup2 = HarnessSupervisor(second).start()
    try:
        assert sup2.wait_for(50) == [f"line {i}" for i in range(100, 150)]
        assert wait_until(lambda: False, 0.2) is False
        assert len(sup2.records) == 50  # no duplicates, no gap
    finally:
        sup2.shutdown()


def test_a_failed_store_saves_no_offset_and_the_lines_come_again(tmp_path):
    directory = tmp_path / "logs"
    directory.mkdir()
    append(directory / "app.log", "a\nb\n")
    receiver = FileTailReceiver(str(directory), **FAST)
    sup = HarnessSupervisor(receiver)
    sup.fail_stores = OSError("driver unreachable")
    sup.start()
    assert wait_until(lambda: sup.restarts, 5)
    assert not os.path.exists(receiver.offsets_path)
    sup.fail_stores = None
    try:
        assert sup.wait_for(2) == ["a", "b"]
    finally:
        sup.shutdown()


def test_start_at_end_skips_what_is_there_on_the_first_start(tmp_path, tail):
    log = tmp_path / "logs" / "app.log"
    append(log, "old\n")
    _, sup = tail(start_at="end")
    assert wait_until(lambda: os.path.exists(_offsets(sup)), 5)
    append(log, "new\n")
    assert sup.wait_for(1) == ["new"]


def test_overlong_lines_are_skipped_and_reported(tmp_path, tail):
    log = tmp_path / "logs" / "app.log"
    append(log, "short\n" + "x" * 5000 + "\nafter\n")
    _, sup = tail(max_record_bytes=1000, max_batch_bytes=1000)
    assert sup.wait_for(2) == ["short", "after"]
    assert any("max_record_bytes" in e for e in sup.errors)


def test_custom_offsets_dir(tmp_path, tail):
    offsets = tmp_path / "offsets"
    append(tmp_path / "logs" / "f", "1\n")
    receiver, sup = tail(offsets_dir=str(offsets), offsets_name="mine.json")
    sup.wait_for(1)
    assert wait_until(lambda: (offsets / "mine.json").exists(), 5)
    assert receiver.offsets_path == str(offsets / "mine.json")


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="start_at"):
        FileTailReceiver("/tmp", start_at="middle")
    with pytest.raises(ConfigError, match="poll_interval_ms"):
        FileTailReceiver("/tmp", poll_interval_ms=0)


def saved_offsets(receiver: FileTailReceiver) -> list[int]:
    with open(receiver.offsets_path) as f:
        return [entry["offset"] for entry in json.load(f)["files"].values()]


def _offsets(sup: HarnessSupervisor) -> str:
    return sup.receiver.offsets_path  # type: ignore[attr-defined]


POISON = b"good 1\nbad \xff\xfe line\ngood 2\n"


def append_bytes(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_a_line_that_is_not_utf8_goes_to_the_policy_and_later_lines_arrive(tmp_path, tail, policy):
    log = tmp_path / "logs" / "app.log"
    append_bytes(log, POISON)
    dead = tmp_path / "dead"
    receiver, sup = tail(
        bad_record_policy=policy, dead_letter_dir=str(dead) if policy == "dead_letter" else None
    )
    assert sup.wait_for(2) == ["good 1", "good 2"]  # skipped, never replaced by U+FFFD
    append(log, "good 3\n")
    assert sup.wait_for(3)[-1] == "good 3"
    assert "is not UTF-8" in sup.wait_for_errors(1)[0]
    assert receiver.bad_records == 1
    assert wait_until(lambda: saved_offsets(receiver) == [log.stat().st_size], 5)
    if policy == "dead_letter":
        (path,) = dead.glob("stream-0-*.jsonl")
        (letter,) = [json.loads(line) for line in path.read_text().splitlines()]
        assert letter["key"] == f"{log}:7"
        assert base64.b64decode(letter["base64"]) == b"bad \xff\xfe line"


def test_a_bad_line_under_fail_keeps_the_lines_before_and_stops_at_its_offset(tmp_path, tail):
    log = tmp_path / "logs" / "app.log"
    append_bytes(log, POISON)
    receiver, sup = tail(bad_record_policy="fail")
    assert wait_until(lambda: sup.stopped_with is not None, 10)
    assert "is not UTF-8" in sup.stopped_with
    assert sup.records == ["good 1"]
    assert saved_offsets(receiver) == [len(b"good 1\n")]  # a restart meets the bad line again


def test_include_timestamp_is_when_the_line_was_read(tmp_path, tail):
    log = tmp_path / "logs" / "app.log"
    before = datetime.now(UTC)
    append(log, "a\n")
    receiver, sup = tail(include_timestamp=True)
    assert receiver.schema.names == ["value", "timestamp"]
    (row,) = sup.wait_for(1)
    assert row["value"] == "a" and before <= row["timestamp"] <= datetime.now(UTC)


class KilledBeforeSave(FileTailReceiver):
    """Its offsets save fails after the first store: as if killed between the two."""

    def _store_at(self, f, lines, offset, skipping):
        super()._store_at(f, lines, offset, skipping)
        self.stop_for_test = True

    def _save_offsets(self):
        if getattr(self, "stop_for_test", False):
            raise ConnectionError("killed between store and offsets save")
        super()._save_offsets()


def restarted(first: HarnessSupervisor, receiver: FileTailReceiver) -> HarnessSupervisor:
    """A new supervisor for a new receiver object whose driver kept ``first``'s positions."""
    first.shutdown()
    sup = HarnessSupervisor(receiver)
    sup.positions = list(first.positions)
    return sup.start()


def test_a_batch_stored_before_the_offsets_save_is_not_stored_again(tmp_path):
    directory = tmp_path / "logs"
    directory.mkdir()
    log = directory / "app.log"
    append(log, "".join(f"line {i}\n" for i in range(100)))
    first = KilledBeforeSave(str(directory), **FAST)
    sup = HarnessSupervisor(first).start()
    assert sup.wait_for(100) == [f"line {i}" for i in range(100)]
    assert wait_until(lambda: sup.restarts, 5)
    assert not os.path.exists(first.offsets_path)  # never saved
    append(log, "".join(f"line {i}\n" for i in range(100, 150)))
    second = FileTailReceiver(str(directory), **FAST)
    sup2 = restarted(sup, second)
    try:
        assert sup2.wait_for(50) == [f"line {i}" for i in range(100, 150)]
        assert wait_until(lambda: False, 0.2) is False
        assert len(sup2.records) == 50  # no duplicates, no gap
        assert second.resumed_from_driver == 1
    finally:
        sup2.shutdown()


def test_a_batch_stored_before_the_save_then_a_rotation_is_read_once(tmp_path):
    directory = tmp_path / "logs"
    directory.mkdir()
    log = directory / "app.log"
    append(log, "a\nb\n")
    setup = FileTailReceiver(str(directory), **FAST)  # a saved offset before the crash
    sup0 = HarnessSupervisor(setup).start()
    sup0.wait_for(2)
    append(log, "".join(f"line {i}\n" for i in range(20)))
    first = KilledBeforeSave(str(directory), **FAST)
    sup = restarted(sup0, first)
    assert sup.wait_for(20) == [f"line {i}" for i in range(20)]
    assert wait_until(lambda: sup.restarts, 5)
    append(log, "tail of the old file\n")
    os.rename(log, directory / "app.log.1")  # rotated while the receiver was down
    append(log, "first of the new file\n")
    second = FileTailReceiver(str(directory), **FAST)
    sup2 = restarted(sup, second)
    try:
        got = sup2.wait_for(2)
        assert sorted(got) == ["first of the new file", "tail of the old file"]
        assert wait_until(lambda: False, 0.3) is False
        assert len(sup2.records) == 2
    finally:
        sup2.shutdown()


def test_a_position_already_saved_changes_nothing(tmp_path):
    directory = tmp_path / "logs"
    directory.mkdir()
    log = directory / "app.log"
    append(log, "a\nb\n")
    first = FileTailReceiver(str(directory), **FAST)
    sup = HarnessSupervisor(first).start()
    sup.wait_for(2)
    with open(log, "w", encoding="utf-8") as f:  # truncated (copytruncate), offset saved as 0
        f.write("")
    assert wait_until(lambda: sup.errors, 5)
    sup.shutdown()
    append(log, "c\n")
    second = FileTailReceiver(str(directory), **FAST)
    sup2 = restarted(sup, second)  # its last position (offset 4) is an older commit
    try:
        assert sup2.wait_for(1) == ["c"]
        assert second.resumed_from_driver == 0
    finally:
        sup2.shutdown()
