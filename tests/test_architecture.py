"""The package's shape: no import circles, rooms that stay apart, modules of a readable size.

Imports are read from the source (``ast``), every ``import``/``from`` of a
``spark_receivers`` module counts, also inside functions and under
``TYPE_CHECKING``: a circle only typing sees is still two rooms that know
each other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "spark_receivers"
MAX_LINES = 450


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


def test_no_module_is_over_the_size_of_one_room():
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"


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
