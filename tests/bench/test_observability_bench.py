"""The observability overhead benchmark's verdict and report (no Spark, no servers)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness import StepResult
from bench.observability import FULL_RATES, capacity, first_failed, render_table, verdict
from bench.run import REPEATED, SECTIONS, section_argv


def step(rate: int, sustained: bool) -> StepResult:
    return StepResult("observability_on", "wordcount", rate, 10.0, rate * 10, rate * 10,
                      sustained=sustained)  # fmt: skip


def session(round_: int, mode: str, cap: int, p50: dict, failed: int | None = None) -> dict:
    steps = [{"offered_rate": cap, "sustained": True}]
    if failed is not None:
        steps.append({"offered_rate": failed, "sustained": False})
    return {"round": round_, "mode": mode, "capacity": cap, "batch_p50_ms": p50, "steps": steps}


def test_capacity_is_the_highest_sustained_rate():
    assert capacity([step(100, True), step(200, True), step(300, False)]) == 200
    assert capacity([step(100, False)]) == 0


def test_each_round_gives_a_range_and_the_ratio_is_the_range_over_the_rounds():
    sessions = [
        session(1, "off", 600_000, {"500000": 800.0, "600000": 900.0}, failed=700_000),
        session(1, "on", 600_000, {"500000": 820.0, "600000": 950.0}, failed=700_000),
        session(2, "on", 500_000, {"500000": 840.0}, failed=600_000),
        session(2, "off", 600_000, {"500000": 780.0}, failed=700_000),
    ]
    v = verdict(sessions)
    assert v["median"] == {"off": 600_000, "on": 550_000}
    assert v["round_bounds"] == {1: [600 / 700, 700 / 600], 2: [500 / 700, 600 / 600]}
    assert v["ratio_bounds"] == [500_000 / 700_000, 700_000 / 600_000]
    assert not v["meets_target"] and not v["misses_target"]
    assert v["processing_p50_ratio_by_rate"][500_000] == 830.0 / 790.0
    text = render_table(sessions, v)
    assert "within **[0.71, 1.17]**" in text and "undecided: met in 0 of 2 runs" in text
    assert "round 1: [0.86, 1.17], round 2: [0.71, 1.00]" in text
    assert "on median 550,000 (500,000 to 600,000 over 2 runs)" in text
    assert "| 2 | on | 500,000 | 500,000: 840 |" in text


def test_the_target_is_met_only_when_every_round_clears_it():
    def pair(r: int, off: tuple[int, int], on: tuple[int, int]) -> list[dict]:
        return [session(r, "off", off[0], {}, off[1]), session(r, "on", on[0], {}, on[1])]

    close = pair(1, (700_000, 710_000), (700_000, 710_000))  # [0.99, 1.01]
    assert verdict(close)["meets_target"]
    # Two rounds that clear it and one that does not: not met.
    three = [*close, *pair(2, (700_000, 710_000), (700_000, 710_000)),
             *pair(3, (600_000, 700_000), (400_000, 500_000))]  # fmt: skip
    v = verdict(three)
    assert not v["meets_target"] and v["misses_target"]
    assert "**not met**: met in 2 of 3 runs, missed in 1" in render_table(three, v)
    unbounded = [session(1, "off", 600_000, {}), session(1, "on", 600_000, {})]
    assert verdict(unbounded)["ratio_bounds"] == [None, None]
    assert not verdict(unbounded)["meets_target"]


def test_the_section_is_registered_in_bench_run_and_repeats():
    assert "observability" in SECTIONS and "observability" in REPEATED
    assert section_argv("observability", quick=True, output="B.md", no_write=True) == [
        "--quick", "--output", "B.md", "--no-write",
    ]  # fmt: skip


def test_accounted_ratio_weighs_the_added_threads_against_the_busy_cores_at_capacity():
    def with_cpu(s: dict, busy: dict, cpu: float | None = None) -> dict:
        s = {**s, "busy_cores": busy}
        if cpu is not None:
            s["steps"] = [
                *s["steps"][:-1],
                {
                    **s["steps"][-1],
                    "extra": {"observability_cpu_s": cpu, "observability_wall_s": 100.0},
                },
            ]
        return s

    sessions = [
        with_cpu(session(1, "off", 600_000, {}, 700_000), {"300000": 1.0, "600000": 1.6}),
        with_cpu(session(1, "on", 600_000, {}, 700_000), {"600000": 1.7}, cpu=1.6),
        with_cpu(session(2, "on", 500_000, {}, 600_000), {}, cpu=8.0),
        with_cpu(session(2, "off", 700_000, {}, 800_000), {"700000": 1.8}),
    ]  # fmt: skip
    v = verdict(sessions)
    # B = median(1.6, 1.8) = 1.7 cores; round 1 used 0.016 cores, round 2 0.08.
    assert v["accounted_ratio_by_round"] == {1: 1 - 0.016 / 1.7, 2: 1 - 0.08 / 1.7}
    assert not v["meets_target_by_accounting"]  # round 2: 0.953
    assert "round 1: 0.991, round 2: 0.953" in render_table(sessions, v)
    sessions[2] = with_cpu(sessions[2], {}, cpu=2.0)
    assert verdict(sessions)["meets_target_by_accounting"]


def test_thread_cpu_is_read_only_when_every_named_thread_is_alive():
    import threading

    from bench.observability import threads_cpu_s

    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    t = threading.Thread(target=spin, name="bench-spinner")
    t.start()
    try:
        stop.wait(0.3)
        cpu = threads_cpu_s(("bench-spinner",))
        assert cpu is not None and cpu > 0
        assert threads_cpu_s(("bench-spinner", "no-such-thread")) is None
    finally:
        stop.set()
        t.join()


def test_the_warm_up_step_is_no_rung_held_or_failed():
    """Each session warms up on its first rung unjudged, as the throughput ladder's do."""
    from dataclasses import replace

    warm = replace(step(62_500, False), extra={"warm_up": True})
    assert capacity([warm, step(62_500, True), step(78_100, False)]) == 62_500
    assert capacity([replace(warm, sustained=True), step(62_500, False)]) == 0
    raw = [warm.to_dict(), step(62_500, True).to_dict(), step(78_100, False).to_dict()]
    assert first_failed(raw) == 78_100
    assert first_failed(raw[:2]) is None


def test_the_rungs_are_the_throughput_ladders_spacing_from_below_a_slow_hours_capacity():
    assert FULL_RATES[0] < 100_000  # 2026-11-29: every session held or failed 100,000
    assert all(b / a <= 1.25 for a, b in itertools.pairwise(FULL_RATES))
    assert FULL_RATES[-1] >= 710_000  # what "off" held on a fast hour (2026-11-24)


def test_the_section_names_its_rungs_and_whether_its_sessions_warmed_up():
    from bench.observability import render

    warm = {"extra": {"warm_up": True}, "offered_rate": 62_500, "sustained": True}
    sessions = [session(1, "off", 62_500, {}, 78_100), session(1, "on", 62_500, {}, 78_100)]
    data = {"rates": [62_500, 78_100], "sessions": sessions}
    assert "no warm-up step" in render(data) and "62,500, 78,100" in render(data)
    for s in sessions:
        s["steps"].insert(0, dict(warm))
    assert "first runs its lowest rung once, unjudged" in render(data)
