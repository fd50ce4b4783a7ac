"""The judging parts of `make chaos` and `make soak`, without a cluster.

The flatness rule of the soak, the generated sections of RELIABILITY.md, the chaos
schedule, and the sink's per-record counts (what "lost" and "duplicated" are computed from).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reliability import report
from reliability.chaos import ChaosSettings
from reliability.sink import SinkWatch
from reliability.soak import trend


def test_a_sawtooth_is_flat_and_a_steady_leak_is_not():
    t = np.arange(0, 1800, 60, dtype=float)
    sawtooth = 1000 + 80 * ((t % 300) / 300)  # a GC cycle every 5 minutes
    assert trend(t, sawtooth)["flat"]
    leak = 1000 + 0.2 * t + np.random.default_rng(1).normal(0, 5, len(t))  # +360 MiB in 30 min
    verdict = trend(t, leak)
    assert not verdict["flat"] and verdict["growth"] > 300
    assert trend(t, np.full(len(t), 392.0))["flat"]  # constant open fds
    assert trend(t, 1000 - 0.2 * t)["flat"]  # shrinking is not growth


def test_sections_are_replaced_in_place_and_the_rest_is_kept(tmp_path):
    path = tmp_path / "RELIABILITY.md"
    report.write_section("chaos", "## make chaos\n\nfirst", path)
    report.write_section("soak", "## make soak\n\nsoak", path)
    report.write_section("chaos", "## make chaos\n\nsecond", path)
    text = path.read_text()
    assert text.startswith(report.HEADER)
    assert "second" in text and "first" not in text and "soak" in text
    assert text.index("<!-- reliability:chaos -->") < text.index("<!-- reliability:soak -->")


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
