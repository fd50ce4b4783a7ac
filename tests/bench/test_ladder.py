"""The throughput ladder's judgement of a step, its sessions and its budget (no Spark)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

# bench/ is a top-level directory of the repository, not part of the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools

import pytest

from bench.capacity import (
    Capacity,
    Target,
    capacities,
    judge_targets,
    over_runs,
    ratio_bounds,
    render_ratios,
)
from bench.child import BatchRecorder
from bench.harness import (
    SESSION_OVERHEAD_S,
    BatchSample,
    SessionResult,
    StepResult,
    delay_slope,
    is_warm_up,
    render_steps_table,
    summarize_step,
)
from bench.ladder import fine_rungs_below, run_ladder, rung_grid

RATE = 1_000  # lines/s; one line sent every millisecond from t = 0


def send_time(seq: int) -> float:
    return seq / RATE


def batches(
    until_s: int,
    *,
    delay_ms: float = 0.0,
    lines: int = RATE,
    processing_ms: float = 500.0,
    growth_ms: float = 0.0,
) -> list[BatchSample]:
    """One batch per second, cut at t = 1, 2, ..., each holding the lines of its second.

    ``growth_ms``: the scheduling delay grows by that much per batch, from ``delay_ms``.
    """
    out = []
    for t in range(1, until_s + 1):
        delay = delay_ms + growth_ms * t
        out.append(BatchSample(t, float(t), t + 0.5 + delay / 1000, lines, processing_ms, delay))
    return out


def judge(step: int, seen: list[BatchSample], **kwargs: object) -> StepResult:
    """Step ``step`` of a session of 10 s steps at RATE, with the batches ``seen``."""
    args: dict = {
        "system": "s",
        "pipeline": "wordcount",
        "offered_rate": RATE,
        "seconds": 10.0,
        "batch_interval_s": 1.0,
        "lines_sent": 10 * RATE,
        "lines_before": 10 * RATE * step,
        "started_at_s": 10.0 * step,
        "send_time_of": send_time,
        "batches": seen,
    }
    args.update(kwargs)
    return summarize_step(**args)


def test_a_later_step_counts_only_its_own_lines():
    # Judged 3 s after the second step ended: 23 batches, 23,000 lines processed in all.
    second = judge(1, batches(23))
    assert second.sustained, second.reason
    assert second.lines_processed == 10 * RATE  # not the 3,000 of the step after it
    assert second.batches_in_window == 5  # cut at 15..19 s: the second half
    # Latency per line, from the global sequence numbers: a batch ends 0.5 s after its cut
    # and holds the lines of the second before it, so they waited 0.5-1.5 s.
    assert second.latency_p50_ms is not None and abs(second.latency_p50_ms - 1_000) < 10
    assert second.latency_max_ms is not None and abs(second.latency_max_ms - 1_491) < 1
    assert second.latency_p99_ms is not None and 1_480 <= second.latency_p99_ms <= 1_491


def test_a_step_whose_lines_are_not_processed_yet_is_not_sustained():
    # Only the first 14 s were processed when the second step is judged: a backlog.
    second = judge(1, batches(14))
    assert not second.sustained
    assert second.lines_processed == 4 * RATE
    assert "processed 4000/10000 sent" in second.reason
    assert "0 batches of the second half completed" in second.reason


def test_scheduling_delay_past_one_interval_fails_the_step():
    second = judge(1, batches(23, delay_ms=1_200))
    assert not second.sustained
    assert "scheduling delay reached 1,200 ms in the last third" in second.reason


def test_a_p50_processing_time_at_the_interval_fails_the_step_even_without_delay():
    # The WAL-on 600k step of the old ladder: every batch a little over a second, no
    # delay recorded yet. Not sustained: the backlog would build.
    second = judge(1, batches(23, processing_ms=1_027.0))
    assert not second.sustained
    assert "batch p50 1,027 ms >= the 1,000 ms interval" in second.reason


def test_a_growing_delay_fails_the_step_while_still_under_one_interval():
    # 30 ms more per batch: 600-690 ms in the last third, under the interval but growing.
    second = judge(1, batches(23, growth_ms=30.0))
    assert not second.sustained
    assert "growing (30 ms per s)" in second.reason
    assert second.extra["delay_growth_ms_per_s"] == 30.0
    # A flat delay with one spike is not growth.
    flat = [
        BatchSample(b.batch_id, b.batch_time_s, b.completed_s, b.lines, 500.0,
                    150.0 if b.batch_id == 18 else 5.0)
        for b in batches(23)
    ]  # fmt: skip
    assert judge(1, flat).sustained


def test_delay_slope_is_the_least_squares_slope():
    assert delay_slope(batches(5, growth_ms=10.0)) == 10.0 / 1000
    assert delay_slope(batches(1)) is None


def test_a_receiver_that_pushes_back_fails_the_step():
    second = judge(1, batches(23), lines_sent=8 * RATE)
    assert "TCP backpressure" in second.reason


def test_the_recorder_reports_a_batch_once_it_has_every_live_field():
    seen: list[dict] = []
    recorder = BatchRecorder(on_update=seen.append)
    recorder.update(7, batch_time_s=1.0, lines=10, completed_s=2.0, processing_ms=900.0)
    assert seen == []  # the scheduling delay comes from the listener, later
    recorder.update(7, scheduling_delay_ms=3.0)
    recorder.update(7, processing_ms=950.0)  # the listener's figure replaces the callback's
    recorder.update(7, processing_ms=950.0, scheduling_delay_ms=3.0)  # a repeat: no change
    assert [e["processing_ms"] for e in seen] == [900.0, 950.0]
    assert recorder.lines == 10


class FakeSystem:
    """A runner whose sessions sustain every rate up to ``ceiling``; a step costs ``cost_s``.

    ``cold``: each session's first step fails whatever its rate (a JVM's start)."""

    def __init__(self, ceiling: int, clock: list[float], cost_s: float, cold: bool = False):
        self.ceiling, self.clock, self.cost_s, self.cold = ceiling, clock, cost_s, cold
        self.budgets: list[float | None] = []

    def __call__(
        self,
        rates: Sequence[int],
        step_s: float,
        batch_interval_s: float = 1.0,
        master: str = "local[4]",
        *,
        pipeline: str = "wordcount",
        budget_s: float | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        warm_up_steps: int = 0,
    ) -> SessionResult:
        self.budgets.append(budget_s)
        out = SessionResult()
        for i, rate in enumerate(rates):
            if budget_s is not None and (i + 1) * self.cost_s > budget_s:
                out.cut_rates = list(rates[i:])
                break
            self.clock[0] += self.cost_s
            ok = rate <= self.ceiling and not (self.cold and i == 0)
            reason = "" if ok else "above the ceiling"
            warm = i < warm_up_steps
            out.steps.append(
                StepResult(
                    "x", pipeline, rate, step_s, 1, 1, sustained=ok, reason=reason,
                    extra={"warm_up": True} if warm else {},
                )
            )  # fmt: skip
            if not ok and not warm:
                break
        return out


def test_rungs_are_geometric_and_never_more_than_the_ratio_apart():
    grid = rung_grid(10_000, 4_000_000)
    assert grid[0] == 10_000 and grid[-2] < 4_000_000 <= grid[-1]
    assert all(1.2 < b / a <= 1.25 for a, b in itertools.pairwise(grid))


def test_coarse_then_fine_sessions_give_every_system_the_same_rungs(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("bench.ladder.time.monotonic", lambda: clock[0])
    grid = rung_grid(100, 10_000)  # 100, 125, 156, 195, 243, 303, 378, 472, 590, ...
    weak = FakeSystem(200, clock, cost_s=10.0)
    strong = FakeSystem(500, clock, cost_s=10.0)
    result = run_ladder({"weak": weak, "strong": strong}, grid, 10.0, coarse_every=4)
    # Coarse: every 4th rung until the first failure; fine: every rung from two rungs below
    # the last coarse rung that held, until its first failure. Each session first warms up
    # (w) at its first rung.
    steps = [
        (s.extra["phase"] + (" w" if is_warm_up(s) else ""), s.offered_rate, s.sustained)
        for s in result.steps
    ]
    assert steps == [
        ("coarse w", 100, True), ("coarse", 100, True), ("coarse", 243, False),  # weak
        ("fine w", 100, True), ("fine", 100, True), ("fine", 125, True), ("fine", 156, True),
        ("fine", 195, True), ("fine", 243, False),
        ("coarse w", 100, True), ("coarse", 100, True), ("coarse", 243, True),  # strong
        ("coarse", 590, False),
        ("fine w", 156, True), ("fine", 156, True), ("fine", 195, True),
        ("fine", 243, True), ("fine", 303, True), ("fine", 378, True), ("fine", 472, True),
        ("fine", 590, False),
    ]  # fmt: skip


def test_a_failed_warm_up_step_neither_ends_the_session_nor_bounds_the_capacity(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("bench.ladder.time.monotonic", lambda: clock[0])
    grid = rung_grid(100, 1_000)
    cold = FakeSystem(200, clock, cost_s=10.0, cold=True)  # every session's first step fails
    result = run_ladder({"cold": cold}, grid, 10.0, coarse_every=4)
    warm_ups = [s for s in result.steps if is_warm_up(s)]
    assert [(s.offered_rate, s.sustained) for s in warm_ups] == [(100, False), (100, False)]
    assert capacities(result.steps) == [Capacity("x", "wordcount", 195, 243)]  # the fake says x
    table = render_steps_table(result.steps)
    assert table.count("| coarse (warm-up) |") == 1 and table.count("| fine (warm-up) |") == 1


def test_capacities_and_ratios_are_bounds_from_held_and_failed_rungs():
    def step(system: str, rate: int, ok: bool) -> StepResult:
        return StepResult(system, "wordcount", rate, 10.0, 1, 1, sustained=ok)

    steps = [
        step("ours", 400, True), step("ours", 500, False),
        step("peer", 100, True), step("peer", 125, False),
        step("top", 900, True),  # never failed: no upper bound
    ]  # fmt: skip
    caps = {c.system: c for c in capacities(steps)}
    assert caps["ours"] == Capacity("ours", "wordcount", 400, 500)
    assert caps["top"].hi is None and caps["top"].label() == "[900, not reached)"
    assert ratio_bounds(caps["ours"], caps["peer"]) == (400 / 125, 500 / 100)
    assert ratio_bounds(caps["top"], caps["peer"])[1] == float("inf")
    one_run = over_runs([list(caps.values())])
    table = render_ratios(one_run)
    assert "| ours | 1 | [3.20x, 5.00x] |" in table
    verdicts = judge_targets(
        one_run,
        [
            Target("wordcount", "ours", "peer", 3.0),  # 3.2 >= 3: met
            Target("wordcount", "ours", "peer", 5.0),  # straddles
            Target("wordcount", "peer", "ours", 0.9),  # at most 0.31: not met
            Target("two_action", "ours", "peer", 3.0),  # not run
        ],
    )
    lines = verdicts.splitlines()
    assert lines[2].endswith("| met in every run (1 of 1) |")
    assert "undecided" in lines[3]
    assert "**not met**" in lines[4]
    assert "not measured" in lines[5]


def test_a_target_whose_rung_spark_alone_cannot_fit_is_marked_out_of_reach():
    caps = over_runs(
        [
            [
                Capacity("ours", "wordcount", 540_000, 675_000),
                Capacity("peer", "wordcount", 222_000, 277_000),
                Capacity("ours", "two_action", 432_000, 540_000),
                Capacity("peer", "two_action", 178_000, 222_000),
            ]
        ]
    )
    targets = [
        Target("wordcount", "ours", "peer", 5.0),  # needs 1,385,000 held
        Target("two_action", "ours", "peer", 3.0),  # needs 666,000 held
        Target("wordcount", "ours", "peer", 1.5),  # met: no remark whatever the floor
    ]
    floor = {"wordcount": 1_310_000, "two_action": 1_310_000}
    rows = judge_targets(caps, targets, floor).splitlines()[2:]
    assert "**not met**: met in 0 of 1 runs, missed in 1; out of reach on this machine" in rows[0]
    assert "needs a rung of at least 1,385,000" in rows[0]
    assert "does not fit a batch of 1,310,000 (query_floor)" in rows[0]
    assert "out of reach" not in rows[1]  # 666,000 < 1,310,000: the floor does not settle it
    assert rows[2].endswith("| met in every run (1 of 1) |")
    assert "out of reach" not in judge_targets(caps, targets)  # no floor measured: no remark
    # 1,385,000 itself is no rung: the lowest rung that would meet the target is 1,630,000.
    grid = rung_grid(10_000, 2_000_000)
    floor = {"wordcount": 1_630_000}
    assert "out of reach" not in judge_targets(caps, targets[:1], floor)  # 1,385,000 < floor
    row = judge_targets(caps, targets[:1], floor, grid).splitlines()[2]
    assert "at least 1,385,000 lines/s held (on this ladder 1,630,000)" in row


def test_a_noisy_rung_above_the_failure_is_flagged_not_counted():
    steps = [
        StepResult("s", "wordcount", 100, 10.0, 1, 1, sustained=True),
        StepResult("s", "wordcount", 125, 10.0, 1, 1, sustained=False),
        StepResult("s", "wordcount", 156, 10.0, 1, 1, sustained=True),
    ]
    (cap,) = capacities(steps)
    assert (cap.lo, cap.hi, cap.noisy) == (100, 125, True)


def test_sessions_share_the_budget_and_pass_on_what_they_leave(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("bench.ladder.time.monotonic", lambda: clock[0])
    weak = FakeSystem(10, clock, cost_s=10.0)
    strong = FakeSystem(1_000, clock, cost_s=10.0)
    result = run_ladder(
        {"weak": weak, "strong": strong},
        [10, 20, 1_000],
        10.0,
        pipelines=("wordcount", "ingest"),
        ingest_systems=["strong"],
        budget_s=300.0,
        coarse_every=1,
        fine=False,
    )
    # Three sessions (no ingest for "weak"): each may use what is left / sessions left, so
    # the 80 s the weak system leaves go to the sessions after it.
    assert weak.budgets == [100.0]  # 300 / 3; a warm-up and 2 steps, at t = 30
    assert strong.budgets == [135.0, 230.0]  # (300 - 30) / 2; 4 steps; then (300 - 70) / 1
    assert [(s.pipeline, s.offered_rate, s.sustained) for s in result.steps] == [
        ("wordcount", 10, True), ("wordcount", 10, True), ("wordcount", 20, False),
        ("wordcount", 10, True), ("wordcount", 10, True), ("wordcount", 20, True),
        ("wordcount", 1_000, True),
        ("ingest", 10, True), ("ingest", 10, True), ("ingest", 20, True),
        ("ingest", 1_000, True),
    ]  # fmt: skip
    assert result.skipped == []


def test_a_session_takes_more_than_its_even_share_when_the_ones_after_it_keep_a_step(
    monkeypatch,
):
    """An even share cut a fine session's rungs while the run ended under its budget."""
    clock = [0.0]
    monkeypatch.setattr("bench.ladder.time.monotonic", lambda: clock[0])
    grid = rung_grid(100, 10_000)
    strong = FakeSystem(472, clock, cost_s=10.0)
    weak = FakeSystem(150, clock, cost_s=10.0)
    result = run_ladder({"a": strong, "b": weak}, grid, 10.0, coarse_every=4, budget_s=270.0)
    # a's fine session runs 8 steps (80 s): an even share, (270 - 40) / 3, is 76.7 s and cut
    # it before 590; the two sessions after it each keep their least (45 s + 2 steps).
    assert strong.budgets == [75.0, 100.0]  # 270 - 3 x 65 = 75 > 270 / 4; then 230 - 2 x 65
    assert result.skipped == []
    fine = [s.offered_rate for s in result.steps if s.extra["phase"] == "fine"][:8]
    assert fine == [156, 156, 195, 243, 303, 378, 472, 590]  # a warm-up, then up to its failure


def test_a_session_that_cannot_afford_a_step_is_skipped_and_listed(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("bench.ladder.time.monotonic", lambda: clock[0])
    system = FakeSystem(1_000, clock, cost_s=10.0)
    result = run_ladder(
        {"a": system}, [10, 20], 10.0, budget_s=SESSION_OVERHEAD_S, coarse_every=1, fine=False
    )
    assert system.budgets == []
    assert result.skipped == [("a", "wordcount", 10), ("a", "wordcount", 20)]
    assert capacities(result.steps) == []


def test_the_readme_paragraph_is_derived_from_the_runs_only():
    import datetime as dt

    from bench.capacity import render_readme_paragraph

    def step(system: str, pipeline: str, rate: int, ok: bool) -> StepResult:
        return StepResult(system, pipeline, rate, 10.0, 1, 1, sustained=ok)

    runs = [
        [
            step("spark_receivers", "two_action", lo, True),
            step("spark_receivers", "two_action", hi, False),
            step("dstream", "two_action", 92_100, True),
            step("dstream", "two_action", 115_000, False),
        ]
        for lo, hi in ((346_000, 432_000), (432_000, 540_000), (346_000, 432_000))
    ]
    text = render_readme_paragraph(
        over_runs([capacities(r) for r in runs]),
        [Target("two_action", "spark_receivers", "dstream", 3.0),
         Target("wordcount", "spark_receivers", "dstream", 5.0)],
        cores=2,
        cpu_model="cpu",
        when=dt.datetime(2026, 11, 24, tzinfo=dt.UTC),
    )  # fmt: skip
    assert "in 3 runs of the ladder" in text
    assert "Two-action word count: spark-receivers [346,000, 432,000)" in text  # the median
    assert "DStream [92,100, 115,000): [3.01x, 5.86x] DStream's capacity" in text
    assert "≥ 3x — met in every run (3 of 3)" in text
    assert "≥ 5x — not measured in this run" in text
    assert "One-action" not in text  # nothing that run did not measure


def test_a_fine_session_starts_as_far_below_the_coarse_hold_at_any_spacing(monkeypatch):
    """Two rungs at 1.25x (1.56x below the hold); at 1.1x five (1.61x), not two (1.21x)."""
    assert fine_rungs_below(1.25) == 2
    assert fine_rungs_below(1.1) == 5
    assert fine_rungs_below(2.0) == 1
    with pytest.raises(ValueError, match="spacing"):
        fine_rungs_below(1.0)
    clock = [0.0]
    monkeypatch.setattr("bench.ladder.time.monotonic", lambda: clock[0])
    grid = rung_grid(100, 2_000, 1.1)
    system = FakeSystem(500, clock, cost_s=10.0)
    result = run_ladder({"s": system}, grid, 10.0, coarse_every=4, spacing=1.1)
    coarse_held = max(
        s.offered_rate
        for s in result.steps
        if s.extra["phase"] == "coarse" and s.sustained and not is_warm_up(s)
    )
    fine_first = next(s.offered_rate for s in result.steps if s.extra["phase"] == "fine")
    assert coarse_held / fine_first >= 1.5, (coarse_held, fine_first)
