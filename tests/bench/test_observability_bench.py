"""The observability overhead benchmark's verdict and report (no Spark, no servers)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness import StepResult
from bench.observability import TARGET, capacity, render, verdict
from bench.run import BEFORE_LADDER, SECTIONS, section_argv


def step(rate: int, sustained: bool) -> StepResult:
    return StepResult("observability_on", "wordcount", rate, 10.0, rate * 10, rate * 10,
                      sustained=sustained)  # fmt: skip


def session(round_: int, mode: str, cap: int, p50: dict) -> dict:
    return {"round": round_, "mode": mode, "capacity": cap, "batch_p50_ms": p50, "steps": []}


def test_capacity_is_the_highest_sustained_rate():
    assert capacity([step(100, True), step(200, True), step(300, False)]) == 200
    assert capacity([step(100, False)]) == 0


def test_the_verdict_compares_median_capacities_and_processing_at_equal_load():
    sessions = [
        session(1, "off", 600_000, {"500000": 800.0, "600000": 900.0}),
        session(1, "on", 600_000, {"500000": 820.0, "600000": 950.0}),
        session(2, "on", 500_000, {"500000": 840.0}),
        session(2, "off", 600_000, {"500000": 780.0}),
    ]
    v = verdict(sessions)
    assert v["median"] == {"off": 600_000, "on": 550_000}
    assert v["ratio"] == 550_000 / 600_000 and not v["meets_target"]
    assert v["processing_p50_ratio_by_rate"][500_000] == 830.0 / 790.0
    text = render(sessions, v)
    assert "on/off = 0.917" in text and f"target >= {TARGET}: NOT met" in text
    assert "| 2 | on | 500,000 | 500,000: 840 |" in text


def test_the_section_is_registered_in_bench_run():
    assert "observability" in SECTIONS and "observability" in BEFORE_LADDER
    assert section_argv("observability", quick=True, output="B.md", no_write=True) == [
        "--quick", "--output", "B.md", "--no-write",
    ]  # fmt: skip
