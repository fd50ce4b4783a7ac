"""The package's shape: no import circles, rooms that import only the rooms below them.

A room is a top-level module or sub-package of ``spark_receivers``. :data:`MAY_IMPORT`
says which rooms each room may import; an arrow not in it fails the test, so a new
dependency between rooms is a decision written here, not an accident. Module sizes are
reported (a warning above :data:`READABLE_LINES`), never a verdict: a module is split
where two jobs meet, not to fit a number (issue 32).

Imports are read from the source (``ast``), every ``import``/``from`` of a
``spark_receivers`` module counts, also inside functions and under
``TYPE_CHECKING``: a circle only typing sees is still two rooms that know
each other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "spark_receivers"
READABLE_LINES = 450

# Which rooms each room may import ("<root>" is the package's __init__, the public facade).
# Executor code (receiver, receivers, wal) never reaches driver code; rpc and util sit low;
# only the facade, the context and the command line may reach everything.
MAY_IMPORT: dict[str, set[str]] = {
    "<root>": {"config", "context", "driver", "errors", "receiver", "receivers", "stream"},
    "__main__": {"cli"},
    "cli": {
        "<root>",
        "config",
        "config_checks",
        "context",
        "driver",
        "errors",
        "receiver",
        "receivers",
        "rpc",
        "util",
    },
    "config": {"config_checks", "config_deploy", "errors", "receiver", "rpc"},
    "config_checks": {"errors", "receiver", "util"},
    "config_deploy": set(),
    "context": {"config", "driver", "errors", "receiver", "rpc", "stream", "util"},
    "driver": {
        "config",
        "config_checks",
        "errors",
        "receiver",
        "rpc",
        "spark",
        "stream",
        "util",
        "wal",
    },
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


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The package modules ``path`` imports (a package import counts as its __init__)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name in known:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, known) - {name} for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


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
    """receiver/ and receivers/ run in the receiver's task: they need nothing of driver/."""
    edges = graph()
    offenders = {
        m: sorted(x for x in i if x.startswith("spark_receivers.driver"))
        for m, i in edges.items()
        if m.startswith(("spark_receivers.receiver.", "spark_receivers.receivers."))
    }
    assert {m: i for m, i in offenders.items() if i} == {}


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def room_arrows(edges: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Every arrow between two rooms, with the module imports that draw it."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for module, imported in edges.items():
        for target in imported:
            a, b = room_of(module), room_of(target)
            if a != b:
                arrows.setdefault((a, b), []).append(f"{module} -> {target}")
    return arrows


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


def test_the_layering_check_sees_a_forbidden_arrow():
    edges = {"spark_receivers.receiver.block": {"spark_receivers.driver.batches.job_generator"}}
    assert ("receiver", "driver") in room_arrows(edges)
    assert "driver" not in MAY_IMPORT["receiver"]


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


def test_importing_the_package_needs_only_what_executors_have():
    """Executors unpickle receivers, which imports ``spark_receivers``: with a shipped zip
    they have pyspark, pyarrow and pandas only (docs/deploy.md), never the driver's
    prometheus-client, aiohttp or rich."""
    code = (
        "import sys, spark_receivers, spark_receivers.testing\n"
        "print(sorted(m for m in ('prometheus_client', 'aiohttp', 'rich', 'redis', 'paho')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
