"""Several runs of one measurement: the median, the spread, and a verdict met only in every run.

One run of a benchmark on a shared 2-core machine says little: the same word count held
620,000, 590,000 and 450,000 lines/s in three rounds of one run. So the capacity ladders and
the tracker run :data:`DEFAULT_REPEATS` times (fresh processes and JVMs each) and report

- the **median** and the **spread** (lowest to highest) of each figure over the runs
  (:class:`Spread`);
- a target as **met** only when every run met it; **not met** as soon as one run clearly
  missed it; otherwise undecided (:func:`verdict`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = ["DEFAULT_REPEATS", "Outcome", "Spread", "verdict"]

DEFAULT_REPEATS = 3


@dataclass(frozen=True)
class Spread:
    """Values of one figure over the runs, in run order."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a spread needs at least one value")

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def lowest(self) -> float:
        return min(self.values)

    @property
    def highest(self) -> float:
        return max(self.values)

    def label(self, fmt: str = ",.0f") -> str:
        """``median 5,297 (4,972 to 5,398 over 3 runs)``; one run: just the value."""
        if len(self.values) == 1:
            return f"{format(self.values[0], fmt)} (1 run)"
        return (
            f"median {format(self.median, fmt)} ({format(self.lowest, fmt)} to "
            f"{format(self.highest, fmt)} over {len(self.values)} runs)"
        )


class Outcome(Enum):
    """A target's verdict in one run: the run's figure (or whole bound) cleared it, fell
    wholly short of it, or (a bound) straddles it."""

    MET = "met"
    MISSED = "missed"
    UNDECIDED = "undecided"


def verdict(outcomes: Sequence[Outcome]) -> str:
    """A target over every run: met only when each run met it.

    >>> verdict([Outcome.MET, Outcome.MET, Outcome.MET])
    'met in every run (3 of 3)'
    >>> verdict([Outcome.MET, Outcome.MISSED, Outcome.MET])
    '**not met**: met in 2 of 3 runs, missed in 1'
    """
    if not outcomes:
        return "not measured"
    n = len(outcomes)
    met = sum(o is Outcome.MET for o in outcomes)
    missed = sum(o is Outcome.MISSED for o in outcomes)
    if met == n:
        return f"met in every run ({met} of {n})"
    if missed:
        return f"**not met**: met in {met} of {n} runs, missed in {missed}"
    return f"undecided: met in {met} of {n} runs, the others' bounds straddle the target"
