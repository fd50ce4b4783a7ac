"""Several runs of one measurement: median, spread, and "met" only when every run met it."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.capacity import (
    Capacity,
    Target,
    capacities,
    judge_targets,
    over_runs,
    ratio_range,
    render_capacities,
    render_ratios,
)
from bench.harness import StepResult
from bench.repeats import Outcome, Spread, verdict


def test_the_median_and_spread_of_three_runs():
    s = Spread((5_297.0, 4_972.0, 5_398.0))
    assert (s.median, s.lowest, s.highest) == (5_297.0, 4_972.0, 5_398.0)
    assert s.label() == "median 5,297 (4,972 to 5,398 over 3 runs)"
    assert Spread((7.0,)).label() == "7 (1 run)"
    with pytest.raises(ValueError, match="at least one value"):
        Spread(())


@pytest.mark.parametrize(
    ("outcomes", "text"),
    [
        ([Outcome.MET] * 3, "met in every run (3 of 3)"),
        ([Outcome.MET, Outcome.MET, Outcome.MISSED], "**not met**: met in 2 of 3 runs, missed"),
        ([Outcome.MET, Outcome.UNDECIDED, Outcome.MET], "undecided: met in 2 of 3 runs"),
        ([Outcome.MISSED, Outcome.UNDECIDED, Outcome.MET], "**not met**: met in 1 of 3 runs"),
        ([], "not measured"),
    ],
)
def test_a_target_is_met_only_when_every_run_met_it(outcomes, text):
    assert verdict(outcomes).startswith(text)


def _run(ours: tuple[int, int | None], peer: tuple[int, int]) -> list[StepResult]:
    def step(system: str, rate: int, ok: bool) -> StepResult:
        return StepResult(system, "two_action", rate, 15.0, 1, 1, sustained=ok)

    steps = [step("ours", ours[0], True), step("peer", peer[0], True), step("peer", peer[1], False)]
    if ours[1] is not None:
        steps.append(step("ours", ours[1], False))
    return steps


# The tracker's afternoon of 2026-11-24 as a ladder: two runs meet 3x, one does not.
RUNS = [
    _run((540_000, 675_000), (178_000, 222_000)),  # [2.43x, 3.79x]: straddles 3x
    _run((675_000, 843_000), (178_000, 222_000)),  # [3.04x, 4.74x]: meets 3x
    _run((843_000, None), (178_000, 222_000)),  # [3.80x, inf]: meets 3x
]


def test_capacities_over_runs_give_each_run_the_median_bound_and_the_spread():
    (ours, peer) = over_runs([capacities(r) for r in RUNS])
    assert [c.label() for c in ours.measured] == [
        "[540,000, 675,000)", "[675,000, 843,000)", "[843,000, not reached)",
    ]  # fmt: skip
    assert ours.median() == Capacity("ours", "two_action", 675_000, 843_000)
    assert ours.spread() == "held 540,000 to 843,000; failed 675,000 to not reached"
    assert peer.spread() == "held 178,000; failed 222,000"
    table = render_capacities([ours, peer])
    assert table.splitlines()[0].startswith("| system | pipeline | run 1 | run 2 | run 3 |")
    assert "| [675,000, 843,000) | held 540,000 to 843,000;" in table


def test_a_ratio_over_runs_is_a_range_never_a_single_figure():
    ours, peer = over_runs([capacities(r) for r in RUNS])
    lo, hi = ratio_range(ours, peer)  # type: ignore[misc]
    assert lo == pytest.approx(540_000 / 222_000) and math.isinf(hi)
    assert "| ours | 1 | [2.43x, ∞] |" in render_ratios([ours, peer])
    # A pair measured in no common run has no ratio at all.
    alone = over_runs([[Capacity("a", "p", 1, 2)], [Capacity("b", "p", 1, 2)]])
    assert ratio_range(alone[0], alone[1]) is None


def test_a_target_met_in_two_runs_of_three_is_not_met():
    caps = over_runs([capacities(r) for r in RUNS])
    target = Target("two_action", "ours", "peer", 3.0)
    row = judge_targets(caps, [target]).splitlines()[2]
    assert row.startswith("| two_action: ours ÷ peer ≥ 3x | [2.43x, 3.79x] | [3.04x, 4.74x] |")
    assert "| [2.43x, ∞] | undecided: met in 2 of 3 runs" in row
    assert "| met" not in row
    # Met in all three: met.
    met = over_runs([capacities(r) for r in RUNS[1:]])
    assert judge_targets(met, [target]).splitlines()[2].endswith("| met in every run (2 of 2) |")
    # One run wholly below it: not met, whatever the others did.
    low = _run((346_000, 432_000), (178_000, 222_000))  # [1.56x, 2.43x]
    row = judge_targets(over_runs([capacities(r) for r in [*RUNS[1:], low]]), [target])
    assert "**not met**: met in 2 of 3 runs, missed in 1" in row


def test_the_throughput_section_renders_every_run_from_its_raw_data():
    from bench.throughput import TARGETS, render

    data = {
        "grid": [178_000, 222_000, 540_000, 675_000, 843_000],
        "targets": [asdict(t) for t in TARGETS],
        "query_floor_fails": {},
        "runs": [
            {"steps": [s.to_dict() for s in steps], "skipped": [], "elapsed_s": 60.0 * (i + 1)}
            for i, steps in enumerate(RUNS)
        ],
    }
    text = render(data)
    assert "### Capacity (offered lines/s), 3 runs" in text
    assert text.count("<details><summary>Run ") == 3 and "Run 2: 4 steps in 2.0 min" in text
    assert "### Ratios, as ranges over the runs" in text
