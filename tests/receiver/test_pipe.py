"""The executor's pipe runs one way: Receiver → Intake → generator → writer → reporter.

Issue 31, item 3. Two kinds of check:

- from the source (``ast``): the supervisor imports none of the data path's stages, only the
  pipe that assembles them; only the intake calls the block generator's adding methods, and
  only the pipe builds a generator;
- from a real run: one record stored with ``Receiver.store`` is followed through every call
  that holds it (the record, the list or block holding it, the Arrow table made of it, the
  block's report) on every thread, until the driver accepted its block. Helper modules that
  are not stages (``schema.py``: record ↔ Arrow; ``block.py``: the block's dataclass) do not
  count. The path must enter each module at most twice and make at most 8 stops, a stop
  being a run of calls inside one module.
"""

from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa

from spark_receivers import Receiver
from spark_receivers.receiver.block import Block
from spark_receivers.receiver.block_handler import BlockStoreResult
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.testing import StandInTracker, supervise

RECEIVER_DIR = Path(__file__).resolve().parents[2] / "spark_receivers" / "receiver"
STAGES = ("intake", "block_generator", "block_writer", "block_handler", "block_reporter")
DATA_PATH = (*STAGES, "block_placement", "block_store", "rate_limiter", "block_pusher")
HELPERS = ("schema", "block")  # library code the stages call, not stages


def imported_receiver_modules(module: str) -> set[str]:
    tree = ast.parse((RECEIVER_DIR / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("spark_receivers.receiver."):
                found.add(node.module.rsplit(".", 1)[1])
            elif node.module == "spark_receivers.receiver":
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("spark_receivers.receiver."):
                    found.add(a.name.rsplit(".", 1)[1])
    return found


def test_the_supervisor_imports_no_stage_of_the_data_path():
    assert imported_receiver_modules("supervisor") & set(DATA_PATH) == set()
    assert "pipe" in imported_receiver_modules("supervisor")


def _calls(path: Path) -> list[tuple[str, str]]:
    """``(attribute, how)`` for every ``x.attr(...)`` call and every bare ``x.attr`` read."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            out.append((node.attr, "attribute"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            out.append((node.func.id, "call"))
    return out


def test_only_the_intake_feeds_the_block_generator_and_only_the_pipe_builds_one():
    adding = {"add_data", "add_many", "add_table", "add_data_with_callback"}
    package = RECEIVER_DIR.parent
    feeders, builders = set(), set()
    for path in package.rglob("*.py"):
        if path == RECEIVER_DIR / "block_generator.py":
            continue
        names = {name for name, _ in _calls(path)}
        if names & adding:
            feeders.add(path.relative_to(package).as_posix())
        if "BlockGenerator" in names:
            builders.add(path.relative_to(package).as_posix())
    assert feeders == {"receiver/intake.py"}
    assert builders == {"receiver/pipe.py"}


class Idle(Receiver):
    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass


class Follower:
    """Records the calls in ``spark_receivers/receiver/`` that hold one record, on any thread.

    A frame holds it when one of its locals (arguments included), looked at when the call
    returns, is the record, a list or tuple holding it, a :class:`Block` whose parts hold it,
    a small Arrow table whose first column has it, or what names its block once stored
    (the handler's result, the block's report).
    """

    def __init__(self, record: str) -> None:
        self.record = record
        self.block_name: str | None = None
        self.lock = threading.Lock()
        self.order = 0
        self.started: dict[int, int] = {}  # id(live frame) -> call order
        self.marked: set[int] = set()  # id(live frame) already counted as a stop
        self.stops: list[tuple[int, str, str]] = []  # (order first seen holding, module, fn)

    def carries(self, value: Any, depth: int = 0) -> bool:
        if value is self.record:
            return True
        if depth > 2:
            return False
        if isinstance(value, list | tuple) and len(value) <= 8:
            return any(self.carries(v, depth + 1) for v in value)
        if isinstance(value, Block):
            if any(self.carries(p, depth + 1) for p in value.parts):
                self.block_name = value.block_id.name
                return True
            return False
        if isinstance(value, pa.Table) and 0 < value.num_rows <= 8 and value.num_columns:
            return self.record in value.column(0).to_pylist()
        if isinstance(value, m.ReceivedBlockInfo | BlockStoreResult):
            return value.block_id == self.block_name
        if isinstance(value, m.AddBlocks):
            return any(self.carries(i, depth + 1) for i in value.block_infos)
        return False

    def _mark(self, frame: FrameType, order: int) -> None:
        """Under the lock: ``frame`` holds the record (once per frame)."""
        if id(frame) in self.marked:
            return
        self.marked.add(id(frame))
        module = Path(frame.f_code.co_filename).stem
        if module not in HELPERS:
            self.stops.append((order, module, frame.f_code.co_name))

    def _holds(self, frame: FrameType) -> bool:
        return any(self.carries(v) for v in list(frame.f_locals.values()))

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        """A frame is a stop from the first moment it is seen holding the record: when it is
        called with it, when it calls another function while holding it (a long-lived loop
        taking it from a queue), or when it returns holding it."""
        if "spark_receivers/receiver/" not in frame.f_code.co_filename:
            return
        with self.lock:
            if event == "call":
                self.order += 1
                self.started[id(frame)] = self.order
                caller = frame.f_back
                if (
                    caller is not None
                    and "spark_receivers/receiver/" in caller.f_code.co_filename
                    and id(caller) in self.started
                    and self._holds(caller)
                ):
                    self._mark(caller, self.order)
                if self._holds(frame):
                    self._mark(frame, self.order)
            elif event == "return":
                order = self.started.pop(id(frame), None)
                if order is not None and self._holds(frame):
                    self._mark(frame, order)
                self.marked.discard(id(frame))

    def path(self) -> list[str]:
        """The modules the record went through, a run of calls in one module as one stop."""
        out: list[str] = []
        for _, module, _ in sorted(self.stops):
            if not out or out[-1] != module:
                out.append(module)
        return out


def test_one_record_goes_one_way_through_the_pipe():
    tracker = StandInTracker()
    record = "the one record " + "x" * 20
    follower = Follower(record)
    threading.setprofile(follower.profile)  # the pipe's threads start after this
    try:
        receiver = Idle()
        sup = supervise(tracker, receiver)  # the defaults: this executor's block keeper
        sup.start()
        sys.setprofile(follower.profile)
        receiver.store(record)
        sys.setprofile(None)
        tracker.wait_for(lambda: tracker.records() == 1)
        (info,) = tracker.blocks()
        for endpoint in info.locations:  # as the driver after the batch
            client = EndpointClient(endpoint, tracker.secret)
            assert client.call(m.RemoveBlocks((info.block_id,))) == 1
            client.close()
        sup.stop("end")
        assert sup.await_termination(15)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        tracker.close()
    path = follower.path()
    assert path[:3] == ["receiver", "block_generator", "block_writer"], follower.stops
    assert path.index("block_reporter") > path.index("block_placement")  # stored, then told
    assert len(path) <= 8, path
    for module in set(path):
        assert path.count(module) <= 2, (module, path)
    assert "supervisor" not in path and "intake" not in path  # one str: the hot path
