"""Summarize a py-spy ``--format raw`` profile: where the samples of chosen threads go.

    py-spy record --format raw -o store.txt -r 200 -- python -m bench.store_bench --no-write
    python -m bench.profile_summary store.txt --thread MainThread --top 15

Each line of a raw (collapsed) profile is ``frame;frame;...;leaf count`` with the root
first; py-spy puts the thread (``thread (0x...)`` or its name) as the first frame when
``--threads`` is given, and a frame reads ``function (file:line)``. This prints, per function
(``function (file)``), the share of samples where it is the leaf (self) and where it is on
the stack (inclusive), over the samples kept by ``--thread`` / ``--under`` filters.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Profile", "frame_key", "parse_collapsed", "summarize_profile"]

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def frame_key(frame: str) -> str:
    """``function (file)`` without the line number; the frame as is when it has no file."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{m.group('fn')} ({Path(m.group('file')).name})"


def parse_collapsed(lines: Iterable[str]) -> list[tuple[list[str], int]]:
    """``(frames root-first, count)`` for every well-formed line."""
    out = []
    for line in lines:
        line = line.rstrip("\n")
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        out.append((stack.split(";"), int(count)))
    return out


@dataclass(frozen=True)
class Profile:
    """Self and inclusive sample counts per function, over ``total`` samples."""

    total: int
    self_counts: Counter[str]
    inclusive: Counter[str]

    def rows(self, top: int) -> list[tuple[str, float, float]]:
        """``(function, self %, inclusive %)``, the ``top`` by inclusive then self share."""
        if self.total == 0:
            return []
        order = sorted(self.inclusive, key=lambda k: (-self.inclusive[k], -self.self_counts[k]))
        keys = order[:top]
        return [
            (k, 100 * self.self_counts[k] / self.total, 100 * self.inclusive[k] / self.total)
            for k in keys
        ]


def summarize_profile(
    stacks: Iterable[tuple[list[str], int]], *, thread: str | None = None, under: str | None = None
) -> Profile:
    """Count samples per function; keep stacks whose frames contain ``thread`` / ``under``."""
    total = 0
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, count in stacks:
        if thread is not None and not any(thread in f for f in frames[:2]):
            continue
        if under is not None:
            idx = next((i for i, f in enumerate(frames) if under in f), None)
            if idx is None:
                continue
            frames = frames[idx:]
        total += count
        keys = [frame_key(f) for f in frames]
        self_counts[keys[-1]] += count
        for k in set(keys):
            inclusive[k] += count
    return Profile(total, self_counts, inclusive)


def render(profile: Profile, top: int) -> str:
    """A Markdown table of the top functions."""
    rows = ["| function | self % | inclusive % |", "|---|---:|---:|"]
    rows += [f"| `{k}` | {s:.1f} | {i:.1f} |" for k, s, i in profile.rows(top)]
    return f"{profile.total:,} samples\n\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile_summary", description=__doc__)
    p.add_argument("raw", help="py-spy --format raw output")
    p.add_argument("--thread", help="keep stacks whose thread frame contains this")
    p.add_argument("--under", help="keep stacks through a frame containing this, rooted there")
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    with open(args.raw) as f:
        profile = summarize_profile(parse_collapsed(f), thread=args.thread, under=args.under)
    print(render(profile, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
