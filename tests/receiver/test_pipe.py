"""The executor's pipe runs one way: Receiver → Intake → generator → writer → reporter.

Issue 31, item 3. Two kinds of check:

- from the source (``ast``): the supervisor imports none of the data path's stages, only the
  pipe that assembles them; ``Receiver.store`` hands what it stores to the intake (or, for one
  ``str``, to the generator's append the intake lends), never to the supervisor; the intake
  calls the block generator and nothing downstream of it; only the intake calls the block
  generator's adding methods, and only the pipe builds a generator;
- from a real run: one record stored with ``Receiver.store``, in each form ``store`` takes
  (one ``str``, a list, a dict of a two-column schema, a reliable store with a position), is
  followed through every call that holds it (the record, the list or block holding it, the
  Arrow table made of it, the block's report) on every thread, until the driver accepted its
  block. Helper modules that are not stages (``schema.py``: record ↔ Arrow; ``block.py``: the
  block's dataclass) do not count. The path must go Receiver → (Intake →) BlockGenerator →
  BlockWriter, store before it reports, enter each module at most twice and make at most 8
  stops, a stop being a run of calls inside one module.
"""

from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa
import pytest

from spark_receivers import Receiver
from spark_receivers.receiver.block import Block
from spark_receivers.receiver.block_writer import BlockStoreResult
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.testing import StandInTracker, supervise

RECEIVER_DIR = Path(__file__).resolve().parents[2] / "spark_receivers" / "receiver"
STAGES = ("intake", "block_generator", "block_writer", "block_reporter")
DATA_PATH = (*STAGES, "block_placement", "block_store", "rate_limiter")
GONE = ("block_pusher", "block_handler")  # modules of the data path that are no more
DATA_HELPERS = ("schema", "bad_records")  # what the stages do to records: not the lifecycle
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
    assert imported_receiver_modules("supervisor") & {*DATA_PATH, *DATA_HELPERS} == set()
    assert "pipe" in imported_receiver_modules("supervisor")


def _function(module: str, qualname: str) -> ast.FunctionDef:
    cls, name = qualname.split(".")
    for node in ast.walk(ast.parse((RECEIVER_DIR / f"{module}.py").read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"no {qualname} in {module}.py")


def _attributes(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def test_store_hands_records_to_the_intake_not_to_the_supervisor():
    store = _attributes(_function("receiver", "Receiver.store"))
    assert "_intake" in store and "admit" in store and "_add_text" in store
    assert "_supervisor" not in store and "_attached" not in store
    # The supervisor gives the receiver the intake, and lends nothing of it as its own.
    init = _function("supervisor", "ReceiverSupervisor.__init__")
    assert "intake" in _attributes(init)
    assert not _attributes(init) & {"add_record", "add_records", "push_table", "add_text"}


def test_the_intake_calls_the_generator_and_nothing_downstream_of_it():
    assert imported_receiver_modules("intake") & {*DATA_PATH} - {"rate_limiter"} == {
        "block_generator"
    }
    calls_on = set()
    tree = ast.parse((RECEIVER_DIR / "intake.py").read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and isinstance(node.func.value.value, ast.Name)
            and node.func.value.value.id == "self"
        ):
            calls_on.add(node.func.value.attr)
    assert calls_on == {"_generator"}


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
    adding = {"add_data", "add_many", "add_table", "add_own_block", "add_data_with_callback"}
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

    def __init__(self, record: Any, cell: str) -> None:
        self.record = record
        self.cell = cell  # the record's value in the first column of an Arrow table
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
            return self.cell in value.column(0).to_pylist()
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
        values = list(frame.f_locals.values())
        if not any(self.carries(v) for v in values):
            return False
        if self.block_name is None:  # a block of its own: named where its table is written
            for v in values:
                if isinstance(v, m.StreamBlockId):
                    self.block_name = v.name
        return True

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


class Pair(Idle):
    schema = "key string, value string"


RECORD = "the one record " + "x" * 20
FORMS = {
    # name: (receiver class, what is stored, the store's keywords, the first stops)
    "one str (the hot path)": (Idle, RECORD, {}, ["receiver", "block_generator"]),
    "a list": (Idle, [RECORD, "b"], {}, ["receiver", "intake", "block_generator"]),
    "a dict of a two-column schema": (
        Pair,
        {"key": RECORD, "value": "v"},
        {},
        ["receiver", "intake", "block_generator"],
    ),
    "reliable, with a position": (
        Idle,
        RECORD,
        {"reliable": True, "position": "p-1"},
        ["receiver", "intake", "block_generator"],
    ),
}


def follow(receiver_class: type[Receiver], data: Any, kwargs: dict[str, Any]) -> Follower:
    """Store ``data`` once under a real supervisor; the calls that held it."""
    tracker = StandInTracker()
    record = data if not isinstance(data, list) else data[0]
    follower = Follower(record, RECORD)
    threading.setprofile(follower.profile)  # the pipe's threads start after this
    try:
        receiver = receiver_class()
        sup = supervise(tracker, receiver)  # the defaults: this executor's block keeper
        sup.start()
        sys.setprofile(follower.profile)
        receiver.store(data, **kwargs)
        sys.setprofile(None)
        tracker.wait_for(lambda: tracker.records() >= 1)
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
    return follower


@pytest.mark.parametrize("form", list(FORMS))
def test_one_record_goes_one_way_through_the_pipe(form):
    receiver_class, data, kwargs, first = FORMS[form]
    follower = follow(receiver_class, data, kwargs)
    path = follower.path()
    assert path[: len(first) + 1] == [*first, "block_writer"], follower.stops
    assert path.index("block_reporter") > path.index("block_placement")  # stored, then told
    assert len(path) <= 8, path
    for module in set(path):
        assert path.count(module) <= 2, (module, path)
    assert "supervisor" not in path
    if form.startswith("one str"):
        assert "intake" not in path  # the intake lends the generator's append: no wrapper


def test_a_position_and_metadata_reach_the_driver_with_their_block_and_nothing_else():
    """The position is a parameter down the pipe, not a key hidden in the metadata."""
    tracker = StandInTracker()
    receiver = Idle()
    sup = supervise(tracker, receiver, block_keeper_enabled=False)
    sup.start()
    try:
        receiver.store(["a", "b"], reliable=True, position="p-7")
        receiver.store(("c",), metadata={"k": "v"}, reliable=True, position="p-8")
        receiver.store("d", metadata={"k": "w"})
        tracker.wait_for(lambda: tracker.records() == 4)
        got = [(i.num_records, i.metadata, i.position) for i in tracker.blocks()]
        assert got == [(2, None, "p-7"), (1, {"k": "v"}, "p-8"), (1, {"k": "w"}, None)]
        assert [i.block_id for i in tracker.blocks()] == [
            f"input-0-{sup.pipe.session}-{n}" for n in range(3)
        ]  # blocks of their own are named by the generator's counter, in order
    finally:
        sup.stop("end")
        assert sup.await_termination(15)
        tracker.close()
