"""The tables of the chaos and soak sections; the sections themselves are written by
``bench/record.py`` (header, raw file, markers), as every generated section is."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def table(rows: list[tuple[str, object]], head: tuple[str, str] = ("", "")) -> str:
    """A two-column Markdown table."""
    lines = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)
