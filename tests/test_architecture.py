"""The package's shape: no import circles, rooms that import only the rooms below them.

A room is a top-level module or sub-package of ``spark_receivers``; the driver's
sub-packages are rooms of their own (``driver.tracking``, ``driver.batches``...), and
``driver`` is what sits directly in ``driver/`` (the job scheduler that composes them).
:data:`MAY_IMPORT` says which rooms each room may import; an arrow not in it fails the
test, so a new dependency between rooms is a decision written here, not an accident.
Between the driver's rooms arrows run one way only; executor code imports no driver
code; ``driver/structured/`` is reached only through its entry points. Module sizes are
reported (a warning above :data:`READABLE_LINES`), never a verdict: a module is split
where two jobs meet, not to fit a number (issue 32; docs/decisions/0012).

Imports are read from the source (``ast``, by ``scripts/import_graph.py``, which also
draws docs/img/import-graph.svg): every ``import``/``from`` of a ``spark_receivers``
module counts, also inside functions and under ``TYPE_CHECKING``: a circle only typing
sees is still two rooms that know each other.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
assert _SPEC and _SPEC.loader
import_graph = importlib.util.module_from_spec(_SPEC)
sys.modules["import_graph"] = import_graph
_SPEC.loader.exec_module(import_graph)

cycles = import_graph.cycles
graph = import_graph.graph
modules = import_graph.modules
room_arrows = import_graph.room_arrows
room_of = import_graph.room_of

READABLE_LINES = 450

DRIVER_ROOMS = {
    "driver",
    "driver.tracking",
    "driver.batches",
    "driver.structured",
    "driver.backpressure",
    "driver.observe",
}
"""The driver and its sub-packages."""
EXECUTOR_ROOMS = {"receiver", "receivers", "wal"}
"""Code that runs in the receiver's task or the block keeper: it needs nothing of driver/."""
STRUCTURED_ENTRY_POINTS = {"spark_receivers.driver.structured"}
"""What the rest of the package may import of driver/structured/: its ``__init__``."""

_LOW = {"config", "config_checks", "errors", "rpc", "util"}

# Which rooms each room may import ("<root>" is the package's __init__, the public facade).
# Executor code (receiver, receivers, wal) never reaches driver code; rpc and util sit low;
# only the facade, the context and the command line may reach everything. Inside the
# driver, one way down: driver (the scheduler) > tracking > batches > structured, and
# every driver room > observe (events and snapshots: the driver's vocabulary).
MAY_IMPORT: dict[str, set[str]] = {
    "<root>": {"config", "context", "driver.observe", "errors", "receiver", "receivers", "stream"},
    "__main__": {"cli"},
    "cli": {"<root>", "context", "driver.observe", "driver.tracking", "receiver", "receivers"}
    | {"spark"}
    | _LOW,
    "config": {"config_checks", "config_deploy", "errors", "receiver", "rpc"},
    "config_checks": {"errors", "receiver", "util"},
    "config_deploy": set(),
    "context": {"driver", "driver.batches", "driver.observe", "driver.tracking"}
    | {"receiver", "stream"}
    | _LOW,
    "driver": (DRIVER_ROOMS - {"driver"}) | {"spark", "wal"} | _LOW,
    "driver.tracking": {"driver.batches", "driver.observe", "receiver", "spark"} | _LOW,
    "driver.batches": {"driver.structured", "driver.observe"}
    | {"receiver", "spark", "stream", "wal"}
    | _LOW,
    "driver.structured": {"errors", "rpc", "util"},
    "driver.backpressure": {"driver.observe", "config", "errors"},
    "driver.observe": {"receiver"} | _LOW,
    "errors": set(),
    "receiver": {"config", "config_checks", "errors", "rpc", "util", "wal"},
    "receivers": {"errors", "receiver", "spark", "util"},
    "rpc": {"config_checks", "errors"},
    "spark": {"config", "errors", "receiver", "rpc", "wal"},
    "stream": {"errors", "receiver", "spark"},
    "testing": {"config", "receiver", "rpc", "util"},
    "util": {"config", "errors"},
    "wal": {"errors", "util"},
}


def without_package_inits(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    # `spark_receivers/__init__.py` re-exports the public API: it imports everything
    # and nothing inside the package imports it, so it cannot close a circle, but a
    # sub-package's __init__ can; keep those.
    return {k: v - {"spark_receivers"} for k, v in edges.items() if k != "spark_receivers"}


def test_there_is_no_import_circle():
    assert cycles(without_package_inits(graph())) == []


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_driver_never_imports_the_public_facade():
    edges = graph()
    offenders = {
        m: sorted(i & {"spark_receivers.context", "spark_receivers"})
        for m, i in edges.items()
        if m.startswith("spark_receivers.driver")
        and i & {"spark_receivers.context", "spark_receivers"}
    }
    assert offenders == {}


def test_executor_code_does_not_import_the_driver():
    """receiver/, receivers/ and wal/ run in the receiver's task or the block keeper.

    They need nothing of driver/, not even for typing.
    """
    offenders = {
        f"{m} -> {x}"
        for m, imported in graph().items()
        if room_of(m) in EXECUTOR_ROOMS
        for x in imported
        if room_of(x) in DRIVER_ROOMS
    }
    assert offenders == set()
    assert not any(MAY_IMPORT[room] & DRIVER_ROOMS for room in EXECUTOR_ROOMS)


def test_every_room_imports_only_the_rooms_it_may():
    arrows = room_arrows(graph())
    unknown_rooms = {a for a, _ in arrows} - set(MAY_IMPORT)
    assert unknown_rooms == set(), (
        f"new rooms: say in MAY_IMPORT what they may import: {unknown_rooms}"
    )
    forbidden = {
        f"{a} -> {b}": sorted(why) for (a, b), why in arrows.items() if b not in MAY_IMPORT[a]
    }
    assert forbidden == {}


def test_the_driver_rooms_arrows_run_one_way():
    """No two of the driver's rooms may import each other, not even through a third."""
    allowed = {room: MAY_IMPORT[room] & DRIVER_ROOMS for room in DRIVER_ROOMS}
    assert cycles(allowed) == []
    drawn: dict[str, set[str]] = {room: set() for room in DRIVER_ROOMS}
    for a, b in room_arrows(graph()):
        if a in DRIVER_ROOMS and b in DRIVER_ROOMS:
            drawn[a].add(b)
    assert cycles(drawn) == []


def test_the_layering_check_sees_a_forbidden_arrow():
    edges = {
        "spark_receivers.receiver.block": {"spark_receivers.driver.batches.job_generator"},
        "spark_receivers.driver.observe.status": {"spark_receivers.driver.tracking.x"},
    }
    arrows = room_arrows(edges)
    assert ("receiver", "driver.batches") in arrows
    assert "driver.batches" not in MAY_IMPORT["receiver"]
    assert ("driver.observe", "driver.tracking") in arrows
    assert "driver.tracking" not in MAY_IMPORT["driver.observe"]
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]


def around_the_entry_points(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a driver/structured/ module, from outside it, that are no entry point."""
    return sorted(
        f"{m} -> {x}"
        for m, imported in edges.items()
        if room_of(m) != "driver.structured"
        for x in imported
        if room_of(x) == "driver.structured" and x not in STRUCTURED_ENTRY_POINTS
    )


def test_structured_streaming_is_reached_only_through_its_entry_points():
    assert around_the_entry_points(graph()) == []


def test_the_entry_point_check_sees_a_module_reached_around_them():
    edges = {
        "spark_receivers.driver.batches.x": {"spark_receivers.driver.structured.block_log"},
        "spark_receivers.driver.structured.block_log": {
            "spark_receivers.driver.structured.offset_events"
        },
        "spark_receivers.driver.job_scheduler": {"spark_receivers.driver.structured"},
    }
    assert around_the_entry_points(edges) == [
        "spark_receivers.driver.batches.x -> spark_receivers.driver.structured.block_log"
    ]


def test_the_picture_of_the_imports_is_the_one_the_code_draws():
    """docs/img/import-graph.svg is drawn from the code: new rooms or arrows redraw it."""
    committed = import_graph.OUTPUT.read_text() if import_graph.OUTPUT.exists() else ""
    assert committed == import_graph.svg(), "run python scripts/import_graph.py"


def test_module_sizes_are_reported():
    """A report, not a verdict: a long module is a question for its reader, not a failure."""
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    long_ones = {name: n for name, n in sorted(sizes.items()) if n > READABLE_LINES}
    if long_ones:
        warnings.warn(
            f"modules over {READABLE_LINES} lines (split one where two jobs meet): {long_ones}",
            stacklevel=1,
        )
    assert sizes and all(n > 0 for n in sizes.values())


def fresh_python_prints(code: str) -> str:
    """What ``code`` prints in a new interpreter (a fresh ``sys.modules``); fails if it fails."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


def test_importing_the_package_needs_only_what_executors_have():
    """Executors unpickle receivers, which imports ``spark_receivers``: with a shipped zip
    they have pyspark, pyarrow and pandas only (docs/deploy.md), never the driver's
    prometheus-client, aiohttp or rich."""
    code = (
        "import sys, spark_receivers, spark_receivers.testing\n"
        "print(sorted(m for m in ('prometheus_client', 'aiohttp', 'rich', 'redis', 'paho')"
        " if m in sys.modules))"
    )
    assert fresh_python_prints(code) == "[]"


def test_every_public_name_loads_from_the_module_it_is_listed_under():
    """``spark_receivers/__init__.py`` lists its names three times (``__all__``, the imports
    for type checkers, ``_EXPORTS`` for loading): ``__all__`` and ``_EXPORTS`` agree, and
    every name is the object its module defines."""
    import spark_receivers as package

    assert set(package.__all__) - {"__version__"} == set(package._EXPORTS)
    for name, module in package._EXPORTS.items():
        assert getattr(package, name) is getattr(importlib.import_module(module), name), name


def test_importing_the_package_imports_none_of_its_modules():
    """A Spark task or a block keeper imports only the modules it uses (decision 0020)."""
    code = (
        "import sys, spark_receivers\n"
        "print(sorted(m for m in sys.modules if m.startswith('spark_receivers.')))"
    )
    assert fresh_python_prints(code) == "[]"
