"""Draw the package's rooms and the imports between them: docs/img/import-graph.svg.

A room is a top-level module or sub-package of ``spark_receivers``; the driver's
sub-packages (``driver/tracking/``, ``driver/batches/``...) are rooms of their own and
``driver`` is what sits directly in ``driver/``. An arrow from room A to room B says
that some module of A imports some module of B (any ``import``, also inside a function
or under ``TYPE_CHECKING``). Rooms stand on floors: a room stands above every room it
imports, so arrows point down; an arrow that points up (two rooms that import each
other) is drawn dashed.

Read from the source with ``ast`` (nothing is imported), standard library only, and
deterministic: the same rooms and arrows draw the same bytes (no sizes, no module
names: the picture changes only when an arrow between rooms does).
``tests/test_architecture.py`` uses the same reading for its layering rules and checks
that the committed picture is the one the code draws::

    python scripts/import_graph.py          # write docs/img/import-graph.svg
    python scripts/import_graph.py --check  # exit 1 if the committed picture is stale
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spark_receivers"
OUTPUT = ROOT / "docs" / "img" / "import-graph.svg"
SUBDIVIDED = ("driver",)
"""Top-level packages whose sub-packages are rooms of their own."""
EXECUTOR_ROOMS = frozenset({"receiver", "receivers", "wal"})


def module_name(path: Path) -> str:
    """``spark_receivers/driver/__init__.py`` → ``spark_receivers.driver``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package, by name."""
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
    """Every module of the package and the package modules it imports."""
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, known) - {name} for name, path in mods.items()}


def room_of(module: str) -> str:
    """The room a module stands in: ``driver.tracking``, ``driver``, ``rpc``, ``<root>``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "<root>"
    if parts[1] in SUBDIVIDED and len(parts) > 2 and (PACKAGE / parts[1] / parts[2]).is_dir():
        return f"{parts[1]}.{parts[2]}"
    return parts[1]


def room_arrows(edges: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Every arrow between two rooms, with the module imports that draw it."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for module, imported in sorted(edges.items()):
        for target in sorted(imported):
            a, b = room_of(module), room_of(target)
            if a != b:
                arrows.setdefault((a, b), []).append(f"{module} -> {target}")
    return arrows


# --- layout -----------------------------------------------------------------------------


def strong_groups(nodes: Iterable[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of the graph (Tarjan), each sorted.

    In a fixed order: a group comes after every group it reaches.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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
            groups.append(sorted(group))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return groups


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every group of more than one node that reach each other: the import circles."""
    return [g for g in strong_groups(edges, edges) if len(g) > 1]


def floors(nodes: list[str], edges: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 0 for a room that imports no other.

    Every room stands above all it imports; rooms that import each other share a floor.
    """
    group_of = {v: i for i, g in enumerate(strong_groups(nodes, edges)) for v in g}
    floor: dict[int, int] = {}

    def height(g: int) -> int:
        if g not in floor:
            below = {group_of[w] for v in nodes if group_of[v] == g for w in edges.get(v, ())}
            below.discard(g)
            floor[g] = 1 + max((height(b) for b in sorted(below)), default=-1)
        return floor[g]

    return {v: height(group_of[v]) for v in nodes}


BOX_H = 34
FLOOR_GAP = 74
CHAR_W = 7.2
PAD_X = 12
GAP_X = 18
MARGIN = 24
TITLE_H = 54


def layout(
    nodes: list[str], edges: dict[str, set[str]], labels: dict[str, str]
) -> dict[str, tuple[float, float, float]]:
    """(x, y, width) of every room's box.

    Floors from the top; each floor ordered under what it imports (the mean place of its
    targets), then by name.
    """
    floor = floors(nodes, edges)
    top = max(floor.values(), default=0)
    width = {v: round(len(labels[v]) * CHAR_W + 2 * PAD_X) for v in nodes}
    centre: dict[str, float] = {}
    rows: dict[int, list[str]] = {}
    for f in range(top + 1):
        row = sorted(v for v in nodes if floor[v] == f)
        placed = {v: [centre[w] for w in edges.get(v, ()) if w in centre] for v in row}
        row.sort(key=lambda v: (sum(placed[v]) / len(placed[v]) if placed[v] else 0.0, v))
        x = float(MARGIN)
        for v in row:
            centre[v] = x + width[v] / 2
            x += width[v] + GAP_X
        rows[f] = row
    widest = max(sum(width[v] + GAP_X for v in row) for row in rows.values()) - GAP_X
    boxes: dict[str, tuple[float, float, float]] = {}
    for f, row in rows.items():
        used = sum(width[v] + GAP_X for v in row) - GAP_X
        x = MARGIN + (widest - used) / 2
        y = TITLE_H + (top - f) * (BOX_H + FLOOR_GAP)
        for v in row:
            boxes[v] = (x, y, width[v])
            x += width[v] + GAP_X
    return boxes


def fill(room: str) -> str:
    """A room's colour: the process it runs in."""
    if room.startswith("driver"):
        return "#dbe9f6"
    if room in EXECUTOR_ROOMS:
        return "#fde2c8"
    return "#eeeeee"


def svg() -> str:
    """The picture, as text; the same code gives the same text."""
    edges_of_modules = graph()
    arrows = room_arrows(edges_of_modules)
    nodes = sorted({room_of(m) for m in edges_of_modules})
    edges: dict[str, set[str]] = {v: set() for v in nodes}
    for a, b in arrows:
        edges[a].add(b)
    labels = {v: v for v in nodes}
    boxes = layout(nodes, edges, labels)
    floor = floors(nodes, edges)

    def n(value: float) -> str:
        return f"{value:.1f}".rstrip("0").rstrip(".")

    # Spread the ends of the arrows along the boxes' edges, in the order of the other end.
    out_x: dict[tuple[str, str], float] = {}
    in_x: dict[tuple[str, str], float] = {}
    for v in nodes:
        x, _, w = boxes[v]
        outs = sorted(edges[v], key=lambda t: (boxes[t][0], t))
        for i, t in enumerate(outs):
            out_x[(v, t)] = x + w * (i + 1) / (len(outs) + 1)
        ins = sorted((s for s in nodes if v in edges[s]), key=lambda s: (boxes[s][0], s))
        for i, s in enumerate(ins):
            in_x[(s, v)] = x + w * (i + 1) / (len(ins) + 1)

    title = "spark_receivers: rooms and their imports; an arrow points at what is imported"
    legend = (
        "drawn by scripts/import_graph.py; blue: driver, orange: executor, "
        "grey: both or the facade; dashed: an arrow up"
    )
    text_w = max(len(title) * CHAR_W * 14 / 12, len(legend) * CHAR_W)
    right = max(max(x + w for x, _, w in boxes.values()), text_w) + MARGIN
    bottom = max(y for _, y, _ in boxes.values()) + BOX_H + MARGIN + 20
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{n(right)}" height="{n(bottom)}" '
        f'viewBox="0 0 {n(right)} {n(bottom)}" font-family="monospace" font-size="12">',
        "<title>spark_receivers: rooms and the imports between them</title>",
        "<defs><marker id='head' viewBox='0 0 10 10' refX='10' refY='5' markerWidth='7' "
        "markerHeight='7' orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' "
        "fill='#555'/></marker></defs>",
        f'<rect x="0" y="0" width="{n(right)}" height="{n(bottom)}" fill="#ffffff"/>',
        f'<text x="{MARGIN}" y="22" font-size="14">{title}</text>',
        f'<text x="{MARGIN}" y="40" fill="#555">{legend}</text>',
    ]
    for a, b in sorted(arrows):
        x1, y1 = out_x[(a, b)], boxes[a][1] + BOX_H
        x2, y2 = in_x[(a, b)], boxes[b][1]
        style = 'stroke="#555"'
        if floor[b] >= floor[a]:
            y1, y2 = boxes[a][1], boxes[b][1] + BOX_H
            style = 'stroke="#c0392b" stroke-dasharray="5,4"'
        body.append(
            f'<line x1="{n(x1)}" y1="{n(y1)}" x2="{n(x2)}" y2="{n(y2)}" {style} '
            f'stroke-width="1" marker-end="url(#head)"><title>{escape(a)} imports '
            f"{escape(b)}</title></line>"
        )
    for v in nodes:
        x, y, w = boxes[v]
        body.append(
            f'<rect x="{n(x)}" y="{n(y)}" width="{n(w)}" height="{BOX_H}" rx="5" '
            f'fill="{fill(v)}" stroke="#333"/>'
        )
        body.append(
            f'<text x="{n(x + w / 2)}" y="{n(y + BOX_H / 2 + 4)}" '
            f'text-anchor="middle">{escape(labels[v])}</text>'
        )
    body.append("</svg>")
    return "\n".join(body) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the picture, or with ``--check`` say whether the committed one is current."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the picture is stale")
    args = parser.parse_args(argv)
    drawn = svg()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != drawn:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run python scripts/import_graph.py")
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(drawn)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
