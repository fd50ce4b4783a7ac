"""Sampled stacks → stages and small flame graphs (SVG), for JFR and py-spy profiles.

- :func:`jfr_stacks`: the ``jdk.ExecutionSample`` events of a Java Flight Recorder file, as
  ``(frames root-first, thread name)`` (``jfr print --json`` of the JDK).
- :func:`parse_collapsed` (``bench.profile_summary``): py-spy's ``--format raw`` lines.
- :func:`stage_shares`: the share of samples per stage, a stack's stage being decided by
  its innermost frame that some rule's pattern is in (:func:`stage_of`).
- :func:`render_svg`: a flame graph of collapsed stacks, frames under ``min_share`` of the
  samples left out, so a graph stays a few tens of kB.
"""

from __future__ import annotations

import html
import json
import subprocess
import tempfile
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.proc_cpu import thread_group

__all__ = [
    "Stack",
    "collapse",
    "jfr_stacks",
    "render_svg",
    "stage_of",
    "stage_shares",
    "top_frames",
]

Stack = tuple[tuple[str, ...], int]
"""Frames root-first and how many samples had exactly that stack."""


def _frame_name(frame: dict[str, Any]) -> str:
    method = frame.get("method", {})
    cls = str(method.get("type", {}).get("name", "?")).replace("/", ".")
    return f"{cls}.{method.get('name', '?')}"


def jfr_stacks(path: Path, stack_depth: int = 64) -> list[tuple[tuple[str, ...], str]]:
    """Every ``jdk.ExecutionSample`` of a JFR file: ``(frames root-first, thread name)``."""
    with tempfile.TemporaryFile("w+") as out:
        subprocess.run(
            ["jfr", "print", "--json", "--events", "jdk.ExecutionSample",
             "--stack-depth", str(stack_depth), str(path)],
            stdout=out, check=True, timeout=600,
        )  # fmt: skip
        out.seek(0)
        data = json.load(out)
    samples = []
    for event in data.get("recording", {}).get("events", []):
        values = event.get("values", {})
        frames = (values.get("stackTrace") or {}).get("frames") or []
        thread = (values.get("sampledThread") or {}).get("javaName") or "?"
        # The thread (its name without a trailing number) is the root frame.
        names = (f"thread {thread_group(str(thread))}", *(_frame_name(f) for f in reversed(frames)))
        samples.append((names, str(thread)))
    return samples


def collapse(stacks: Iterable[tuple[str, ...]]) -> list[Stack]:
    """Identical stacks counted together."""
    return list(Counter(stacks).items())


def stage_of(
    frames: Sequence[str], rules: Sequence[tuple[str, Sequence[str]]], other: str = "other"
) -> str:
    """The stage of one stack: the innermost frame (leaf first) that a rule's pattern is in
    decides, rules tried in order on each frame; ``other`` when no frame matches."""
    for frame in reversed(frames):
        for name, patterns in rules:
            if any(p in frame for p in patterns):
                return name
    return other


def stage_shares(
    stacks: Iterable[Stack], rules: Sequence[tuple[str, Sequence[str]]], other: str = "other"
) -> dict[str, float]:
    """The share (0-1) of samples per stage (:func:`stage_of`), largest first."""
    counts: Counter[str] = Counter()
    total = 0
    for frames, n in stacks:
        total += n
        counts[stage_of(frames, rules, other)] += n
    if total == 0:
        return {}
    return {k: v / total for k, v in counts.most_common()}


def top_frames(stacks: Iterable[Stack], top: int = 12) -> list[tuple[str, float]]:
    """The leaf frames (self time) with the largest shares of the samples."""
    counts: Counter[str] = Counter()
    total = 0
    for frames, n in stacks:
        total += n
        counts[frames[-1] if frames else "?"] += n
    return [(k, v / total) for k, v in counts.most_common(top)] if total else []


class _Node:
    __slots__ = ("children", "count", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self.children: dict[str, _Node] = {}


def _tree(stacks: Iterable[Stack], max_depth: int) -> _Node:
    root = _Node("all")
    for frames, n in stacks:
        node = root
        node.count += n
        for name in frames[:max_depth]:
            node = node.children.setdefault(name, _Node(name))
            node.count += n
    return root


def _color(name: str) -> str:
    h = zlib.crc32(name.encode())
    return f"rgb({205 + h % 50},{80 + (h >> 8) % 120},{40 + (h >> 16) % 40})"


def render_svg(
    stacks: Iterable[Stack],
    title: str,
    *,
    min_share: float = 0.005,
    width: int = 1200,
    row_px: int = 16,
    max_depth: int = 48,
) -> str:
    """A flame graph (root at the bottom) of ``stacks``; hover a frame for its share."""
    root = _tree(stacks, max_depth)
    total = root.count or 1
    boxes: list[tuple[str, int, float, int, float]] = []  # name, count, x, depth, width

    def walk(node: _Node, x: float, depth: int) -> None:
        boxes.append((node.name, node.count, x, depth, node.count / total * width))
        child_x = x
        for child in sorted(node.children.values(), key=lambda c: c.name):
            if child.count / total >= min_share:
                walk(child, child_x, depth + 1)
            child_x += child.count / total * width

    walk(root, 0.0, 0)
    height = (max(b[3] for b in boxes) + 1) * row_px + 30
    body = "\n".join(
        _rect(name, count, total, x, height - 4 - (depth + 1) * row_px, w)
        for name, count, x, depth, w in boxes
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">\n'
        f'<text x="4" y="16" font-size="13">{html.escape(title)} ({root.count:,} samples; '
        f"frames under {min_share:.1%} left out)</text>\n{body}\n</svg>\n"
    )


def _rect(name: str, count: int, total: int, x: float, y: int, w: float) -> str:
    label = html.escape(name)
    chars = int(w / 7)
    shown = name if len(name) <= chars else (name[: chars - 2] + ".." if chars > 3 else "")
    text = f'<text x="{x + 2:.1f}" y="{y + 12}">{html.escape(shown)}</text>' if shown else ""
    return (
        f"<g><title>{label} ({count:,} samples, {count / total:.1%})</title>"
        f'<rect x="{x:.1f}" y="{y}" width="{max(w - 0.5, 0.1):.1f}" height="15" '
        f'fill="{_color(name)}"/>{text}</g>'
    )
