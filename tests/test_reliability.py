"""The judging parts of `make chaos` and `make soak`, without a cluster.

The soak's rule (the slope over its second half), the sections of RELIABILITY.md rendered
from a run's raw data, the chaos schedule, and the sink's per-record counts (what "lost" and
"duplicated" are computed from).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reliability.chaos import ChaosSettings
from reliability.sink import SinkWatch
from reliability.soak import LIMITS_PER_H, SERIES, SoakSettings, judge, render, slope_fit

HOUR = 3600.0


def soak_samples(series: dict[str, np.ndarray], t: np.ndarray) -> list[dict[str, float]]:
    flat = {key: np.full(len(t), 400.0) for key, _, _ in SERIES}
    return [
        {"t_s": float(x), **{k: float(v[i]) for k, v in {**flat, **series}.items()}}
        for i, x in enumerate(t)
    ]


def gc_noise(t: np.ndarray, seed: int = 30) -> np.ndarray:
    """A garbage-collection sawtooth (60 MiB every 7 minutes) and some jitter."""
    return 60 * ((t % 420) / 420) + np.random.default_rng(seed).normal(0, 4, len(t))


def test_a_warm_up_then_flat_series_passes():
    t = np.arange(30, 2 * HOUR + 1, 30.0)  # two hours, a sample every 30 s
    # +400 MiB in the first hour (caches, JIT, allocator arenas), level in the second.
    warming = 1_500 + 400 * (1 - np.exp(-t / 900)) + gc_noise(t)
    verdicts = judge(soak_samples({"driver_rss_mib": warming}, t), 2 * HOUR)
    rss = verdicts["driver_rss_mib"]
    assert rss["ok"], rss
    assert rss["warmup_slope_per_h"] > 200  # it grew, in the part that is not judged
    assert abs(rss["slope_per_h"]) <= LIMITS_PER_H["driver_rss_mib"]
    assert rss["samples"] == 121 and rss["from_s"] == HOUR
    assert all(v["ok"] for v in verdicts.values())


def test_a_steady_20_mib_per_hour_over_the_second_hour_fails():
    t = np.arange(30, 2 * HOUR + 1, 30.0)
    flat_then_leak = 3_000 + np.where(t < HOUR, 0.0, 20 * (t - HOUR) / HOUR) + gc_noise(t)
    rss = judge(soak_samples({"executor_rss_mib": flat_then_leak}, t), 2 * HOUR)
    verdict = rss["executor_rss_mib"]
    assert not verdict["ok"], verdict
    assert 15 < verdict["slope_per_h"] < 25
    # The spread is reported: a 60 MiB sawtooth alone blurs an hour's slope by a few MiB/h.
    assert 0 < verdict["se_per_h"] < verdict["slope_per_h"] / 2
    # What the 30-minute rule of 2026-11-24 called "flat" is a leak under this one.
    t = np.arange(30, HOUR + 1, 30.0)
    old = judge(soak_samples({"driver_rss_mib": 1_700 + 71 * t / HOUR + gc_noise(t)}, t), HOUR)
    assert not old["driver_rss_mib"]["ok"]


def test_open_files_and_wal_disk_are_judged_too_and_too_few_samples_fail():
    t = np.arange(30, 2 * HOUR + 1, 30.0)
    fds = 755 + np.floor(t / 60)  # one descriptor more every minute: 60 an hour
    verdicts = judge(soak_samples({"executor_fds": fds}, t), 2 * HOUR)
    assert not verdicts["executor_fds"]["ok"] and verdicts["wal_mib"]["ok"]
    short = judge(soak_samples({}, np.array([10.0, 20.0, 30.0])), 30.0)
    assert not short["driver_rss_mib"]["ok"] and "2 samples" in short["driver_rss_mib"]["why"]


def test_the_slope_fit_gives_the_slope_per_hour_and_its_standard_error():
    t = np.arange(0, HOUR, 60.0)
    fit = slope_fit(t, 100 + 12 * t / HOUR)
    assert fit["slope_per_h"] == pytest.approx(12.0) and fit["se_per_h"] == pytest.approx(0)
    noisy = slope_fit(t, 100 + np.random.default_rng(1).normal(0, 10, len(t)))
    assert noisy["se_per_h"] > 1
    with pytest.raises(ValueError, match="at least 3 samples"):
        slope_fit(t[:2], t[:2])


def _soak_out(growth_per_h: float, noise_mib: float = 0.0) -> dict:
    settings = SoakSettings(minutes=120, sample_s=30)
    t = np.arange(30, 2 * HOUR + 1, 30.0)
    noise = np.random.default_rng(5).normal(0, noise_mib, len(t)) if noise_mib else 0.0
    samples = soak_samples({"driver_rss_mib": 1_700 + growth_per_h * t / HOUR + noise}, t)
    for s in samples:
        s["driver_jvm_rss_mib"] = 1_175.0
    trends = judge(samples, 2 * HOUR)
    return {
        "settings": asdict(settings), "capacity": 44_973, "capacity_from": "a backlog",
        "rate": 22_486, "sent": 10, "processed": 10, "max_delay_ms": 3, "driver_exit": 0,
        "samples": samples, "trends": trends, "ok": all(v["ok"] for v in trends.values()),
    }  # fmt: skip


def test_the_soak_section_gives_each_slope_with_its_spread_and_never_calls_growth_flat():
    text = render(_soak_out(71.0))
    assert "| result | **FAILED** |" in text
    row = next(line for line in text.splitlines() if line.startswith("| driver RSS |"))
    assert "+71.0 ± 0.0 MiB/h | ≤ 10 MiB/h |" in row and row.endswith("| **grows** |")
    assert "flat" not in text.lower()
    assert "judged: the second half, from minute 60" in text
    ok = render(_soak_out(0.0))
    assert "| result | **OK** |" in ok and "| ok |" in ok and "cannot tell" not in ok
    noisy = render(_soak_out(0.0, noise_mib=40.0))  # ± 2 SE of about 25 MiB/h
    assert "(the spread is wider than the limit: this run cannot tell)" in noisy


def test_the_chaos_section_renders_from_its_raw_data():
    from reliability.chaos import render as render_chaos

    settings = ChaosSettings(duration_s=45, rate=2_000, counts=(("worker", 1), ("driver", 1)))
    faults = [
        {"kind": "worker", "at_s": 5, "detail": "", "recovery_s": 3.5, "acks_while_on": None,
         "error_reported": None},
        {"kind": "driver", "at_s": 20, "detail": "", "recovery_s": 40.0, "acks_while_on": None,
         "error_reported": None},
    ]  # fmt: skip
    out = {
        "settings": json.loads(json.dumps(asdict(settings))), "seed": 3, "seconds": 80,
        "faults": faults, "faults_done": {"worker": 1, "driver": 1}, "sent": 90_000,
        "acked": 90_000, "delivered": 90_000, "lost": 0, "duplicated": 12,
        "duplicated_unexplained": 0, "unacked_end": 0, "driver_exit": 0,
        "peak_rss_mib": {"driver": 1_700, "executor": 1_400, "keeper": 100}, "ok": True,
    }  # fmt: skip
    text = render_chaos(out)
    assert "| result | **OK** |" in text and "| offered load | 2,000 records/s |" in text
    assert "| recovery: worker x1 | p50 3.5 s, max 3.5 s |" in text
    assert "45 s of faults; 80 s in all (seed 3)" in text


def test_the_schedule_has_every_fault_once_per_slice():
    settings = ChaosSettings(duration_s=100, counts=(("worker", 3), ("driver", 1), ("eio", 1)))
    schedule = settings.schedule(random.Random(4))
    assert sorted(k for _, k in schedule) == ["driver", "eio", "worker", "worker", "worker"]
    offsets = [o for o, _ in schedule]
    assert offsets == sorted(offsets) and all(0 <= o < 100 for o in offsets)
    assert all(i * 20 <= o < (i + 1) * 20 for i, o in enumerate(offsets))


def write_batch(out: Path, t: int, values: list[int], complete: bool = True) -> None:
    d = out / f"batch_time_ms={t}"
    d.mkdir(parents=True)
    pq.write_table(pa.table({"value": [str(v) for v in values]}), d / "part-0.parquet")
    if complete:
        (d / "_SUCCESS").touch()


def test_sink_counts_read_complete_batches_only(tmp_path):
    write_batch(tmp_path, 1000, [0, 1, 2])
    write_batch(tmp_path, 2000, [2, 3])  # 2 delivered twice
    write_batch(tmp_path, 3000, [4], complete=False)  # a write that never finished
    sink = SinkWatch(tmp_path)
    assert sink.poll() == 2000
    assert sink.counts(5).tolist() == [1, 1, 2, 1, 0]
    assert sink.incomplete() == [3000]
