"""Pure logic of the benchmarks: WAL verdicts, send schedules, reports (no Spark, no servers)."""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

# bench/ is a top-level directory of the repository, not part of the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import proc_cpu
from bench.harness import StepResult, render_steps_table
from bench.receiver_start import SHOWN, _row
from bench.receivers import wal_status
from bench.run import section_argv
from bench.store_bench import RECORD_BYTES, FormResult, floor_rate, make_records
from bench.store_bench import render as render_store
from bench.throughput import render as render_throughput
from bench.throughput import throughput_notes
from bench.tracker_bench import TrackerResult, cpu_seconds, percentile, schedule, summarize
from bench.tracker_bench import render as render_tracker


def step(system: str, **extra: object) -> StepResult:
    return StepResult(system, "wordcount", 10_000, 10.0, 100, 100, extra=dict(extra))


# -- WAL verdict ---------------------------------------------------------------------------------


def test_wal_in_effect_needs_driver_wal_handles_and_bytes():
    report = {"driver_wal": True, "blocks": 10, "blocks_with_wal_handle": 10}
    ok = step("spark_receivers_wal", wal={**report, "checkpoint_bytes": 5000})
    assert "WAL in effect" in wal_status([ok])
    assert "NOT in effect" not in wal_status([ok])


@pytest.mark.parametrize(
    "report",
    [
        {"driver_wal": False, "blocks": 10, "blocks_with_wal_handle": 0, "checkpoint_bytes": 0},
        {"driver_wal": True, "blocks": 10, "blocks_with_wal_handle": 0, "checkpoint_bytes": 900},
        {"driver_wal": True, "blocks": 10, "blocks_with_wal_handle": 10, "checkpoint_bytes": 0},
    ],
)
def test_wal_not_in_effect_is_reported_loudly(report):
    text = wal_status([step("spark_receivers_wal", wal=report)])
    assert "NOT in effect" in text
    assert "spark_receivers_wal" in text


def test_wal_status_sums_steps_and_ignores_other_systems():
    a = {"driver_wal": True, "blocks": 3, "blocks_with_wal_handle": 3, "checkpoint_bytes": 10}
    text = wal_status([step("dstream"), step("spark_receivers_wal", wal=a)] * 2)
    assert "6/6 blocks" in text and "20 bytes" in text
    assert "dstream" not in text
    assert wal_status([step("dstream")]) == ""


def test_wal_status_without_report_names_the_error():
    s = StepResult("spark_receivers_wal", "wordcount", 10, 1.0, 0, 0, error="ConfigError: boom")
    assert "no WAL report" in wal_status([s]) and "ConfigError: boom" in wal_status([s])


def test_pipeline_table_renders_missing_values_as_dashes():
    from bench.store_bench import render_pipeline_table

    table = render_pipeline_table(
        [
            {
                "form": "one",
                "rate": 624312.5,
                "rate_limit": None,
                "batches": 16,
                "batch_p50_ms": 578.0,
                "max_sched_delay_ms": None,
            },
        ]
    )
    assert table.splitlines()[-1] == "| one | 624,312 | - | 16 | 578 | - |"


# -- run.py --------------------------------------------------------------------------------------


def test_section_argv_passes_quick_repeats_and_outputs_and_the_ladder_options():
    assert section_argv("store", quick=True, output="X.md") == ["--quick", "--output", "X.md"]
    # --repeats goes to the sections that repeat, and only to them.
    assert section_argv("tracker", repeats=5, no_write=True) == [
        "--repeats", "5", "--no-write",
    ]  # fmt: skip
    assert section_argv("wal", repeats=5, results_dir="r") == ["--results-dir", "r"]
    ladder = {"systems": "dstream", "seconds": 10.0, "lowest": None}
    assert section_argv("throughput", ladder=ladder) == [
        "--systems", "dstream", "--seconds", "10.0",
    ]  # fmt: skip
    assert section_argv("store", ladder=ladder) == []  # the ladder's options are its own
    with pytest.raises(ValueError, match="must be one of"):
        section_argv("nonsense")


def test_throughput_notes_carry_load_and_wal_verdict_of_every_run():
    report = {"driver_wal": False, "blocks": 1, "blocks_with_wal_handle": 0}
    steps = [
        step("dstream", load_1m=3.5),
        step("spark_receivers_wal", load_1m=9.25, wal={**report, "checkpoint_bytes": 0}),
    ]
    notes = throughput_notes([steps, [step("dstream", load_1m=1.0)]])
    assert "1.0-9.2" in notes and "NOT in effect" in notes and "run 1:" in notes
    assert "| 9.2 |" in render_steps_table(steps) or "| 9.3 |" in render_steps_table(steps)


def test_a_throughput_section_says_when_its_rungs_are_not_the_default_spacing():
    run = {"steps": [step("dstream", load_1m=1.0).to_dict()], "skipped": [], "elapsed_s": 60}
    data = {"grid": [10_000, 11_000], "targets": [], "runs": [run]}
    assert "rungs are" not in render_throughput(data)  # a raw file from before --spacing
    finer = render_throughput({**data, "spacing": 1.1})
    assert "**This run's rungs are 1.1x apart** (`--spacing 1.1`), not 1.25x" in finer
    assert "bounded at >= 0.91x of each other" in finer


def test_the_steps_table_shows_the_busy_cores_a_session_recorded():
    table = render_steps_table([step("dstream", load_1m=1.0, busy_cores=1.874), step("dstream")])
    rows = table.splitlines()
    assert rows[0].endswith("| load 1m | busy cores | sustained |")
    assert "| 1.0 | 1.87 |" in rows[2] and "| - | - |" in rows[3]


# -- store bench ---------------------------------------------------------------------------------


def test_records_are_distinct_and_100_bytes():
    records = make_records()
    assert len(set(records)) == len(records) == 1000
    assert {len(r.encode()) for r in records} == {RECORD_BYTES}


def test_floor_rate_is_positive():
    assert floor_rate(make_records(10), 0.01) > 0


def test_store_section_marks_missed_targets_and_ratio():
    results = [
        FormResult("one", 1_000_000, 1.0, 2.0, 10, floor=1e6),
        FormResult("arrow", 40_000_000, 1.0, 1.0, 9, floor=1e6),
    ]
    text = render_store({"results": [asdict(r) for r in results], "pipeline": []})
    one = next(line for line in text.splitlines() if line.startswith("| one "))
    arrow = next(line for line in text.splitlines() if line.startswith("| arrow "))
    assert "500,000" in one and "| 1,000,000 | 0.50 | 0.26 | yes |" in one  # ratio met
    assert "| **no** |" in one
    assert "| yes | 1,000,000 | 40.00 | 5.26 | yes |" in arrow


# -- tracker bench -------------------------------------------------------------------------------


def test_schedule_sends_every_supervisor_at_its_rate_in_order():
    sends = schedule(10, 5.0, 2.0, seed=1)
    assert [t for t, _ in sends] == sorted(t for t, _ in sends)
    assert all(0 <= t < 2.0 for t, _ in sends)
    per = {i: [t for t, j in sends if j == i] for i in range(10)}
    for times in per.values():
        assert len(times) == 10
        assert all(abs((b - a) - 0.2) < 1e-9 for a, b in itertools.pairwise(times))
    with pytest.raises(ValueError, match="rate_per_s"):
        schedule(1, 0, 1.0)


def test_percentile_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99.0


def test_summarize_merges_client_reports():
    reports = [
        {"offered": 10, "latencies_ms": [1.0, 2.0], "lags_ms": [0.0, 1.0], "failed": 1,
         "first_error": None, "cpu_s": 0.5, "calls": 1},
        {"offered": 10, "latencies_ms": [3.0], "lags_ms": [5.0], "failed": 0,
         "first_error": "RpcError: x", "cpu_s": 0.5, "calls": 1},
    ]  # fmt: skip
    r = summarize(
        supervisors=4, rate=5.0, clients=2, seconds=2.0, reports=reports, accepted=3,
        driver_cpu_s=1.0, steady_accepted_rate=1.6,
    )  # fmt: skip
    assert (r.offered, r.completed, r.failed, r.latency_max_ms) == (20, 3, 1, 3.0)
    assert r.completed_rate == 1.5 and r.offered_rate == 20.0
    assert r.driver_cpu_pct == 50.0 and r.clients_cpu_pct == 50.0
    assert r.first_error == "RpcError: x"
    text = render_tracker({"target_per_s": 5000, "runs": [{**asdict(r), "repeat": 1}]})
    # 1.5 blocks/s accepted in 1 call/s (1.5 blocks per call); far below the 5,000/s target.
    assert "| 1 | 4 x 5 | 20 | 2 | **no** | 2 | 1 | 1.5 | 1 |" in text and "RpcError: x" in text


def test_the_tracker_target_needs_the_rate_and_keeping_up_with_the_offer():
    def result(offered_per_supervisor: float, steady: float) -> TrackerResult:
        return TrackerResult(1000, offered_per_supervisor, 4, 20.0, 0, 0, 0, 0, None, None,
                             None, None, 0.0, 0.0, steady_accepted_rate=steady)  # fmt: skip

    assert result(5, 4_990).meets() is False  # under 5,000
    assert result(5, 5_000).meets() is True
    assert result(6, 5_500).meets() is False  # 5,500 of 6,000 offered: fell behind
    assert result(6, 5_900).meets() is True


def test_tracker_result_rates_with_zero_window():
    r = TrackerResult(1, 5.0, 1, 0.0, 0, 0, 0, 0, None, None, None, None, 0.0, 0.0)
    assert r.completed_rate == 0.0


def test_cpu_seconds_of_this_process():
    assert cpu_seconds(os.getpid()) > 0


# -- profile summary -----------------------------------------------------------------------------


def test_profile_summary_self_and_inclusive_shares():
    from bench.profile_summary import frame_key, parse_collapsed, summarize_profile

    raw = [
        "thread (0x1);run (a.py:1);store (receiver.py:90);add_data (block_generator.py:150) 6\n",
        "thread (0x1);run (a.py:1);store (receiver.py:91) 2\n",
        "thread (0x2);push (b.py:3) 2\n",
        "garbage line\n",
    ]
    stacks = parse_collapsed(raw)
    assert len(stacks) == 3
    assert frame_key("store (/x/y/receiver.py:90)") == "store (receiver.py)"
    prof = summarize_profile(stacks)
    assert prof.total == 10
    rows = {k: (s, i) for k, s, i in prof.rows(10)}
    assert rows["store (receiver.py)"] == (20.0, 80.0)
    assert rows["add_data (block_generator.py)"] == (60.0, 60.0)
    only = summarize_profile(stacks, thread="0x2")
    assert only.total == 2
    under = summarize_profile(stacks, under="store")
    assert under.total == 8 and "run (a.py)" not in under.inclusive


# -- backpressure.py and wal_bench.py ------------------------------------------------------------


def _bp_run(backpressure: bool, delays_s: list[float], held: list[int], sent: int, processed: int):
    n = len(delays_s)
    return {
        "backpressure": backpressure,
        "offered": 30_000,
        "capacity": 10_000,
        "seconds": float(n),
        "sent": sent,
        "processed": processed,
        "batches": [
            {"s": float(i), "t": i * 1000, "records": 10_000, "processing_ms": 900,
             "scheduling_ms": int(d * 1000)}
            for i, d in enumerate(delays_s)
        ],
        "samples": [
            {"s": float(i), "sent": 0, "received": 0, "held": h, "rate_limit": None}
            for i, h in enumerate(held)
        ],
    }  # fmt: skip


def test_backpressure_verdict_on_needs_bounded_delay_and_memory_and_nothing_dropped():
    from bench.backpressure import render_table, verdict

    good = _bp_run(True, [3.0, 2.5] + [0.5] * 18, [30_000] * 10 + [20_000] * 10, 500, 500)
    assert verdict(good)["ok"]  # the warm-up (first 20 %) may be slow
    late_spike = _bp_run(True, [0.1] * 15 + [2.5] + [0.1] * 4, [10] * 20, 500, 500)
    assert not verdict(late_spike)["delay_bounded"]
    growing = _bp_run(True, [0.1] * 20, [10] * 10 + [100] * 10, 500, 500)
    assert not verdict(growing)["memory_bounded"]
    dropped = _bp_run(True, [0.1] * 20, [10] * 20, 500, 499)
    assert not verdict(dropped)["nothing_dropped"] and not verdict(dropped)["ok"]
    assert "processed == sent: NO" in render_table([dropped])


def test_backpressure_verdict_off_wants_the_delay_to_grow():
    from bench.backpressure import verdict

    grows = _bp_run(False, [float(i) for i in range(20)], [0] * 20, 10, 5)
    assert verdict(grows)["delay_grows"]
    flat = _bp_run(False, [0.5] * 20, [0] * 20, 10, 10)
    assert not verdict(flat)["ok"]


def test_wal_bench_verdicts_compare_with_the_targets():
    from bench.wal_bench import render_table, verdicts

    results = {
        "write": [{"size": 65536, "raw_mb_s": 100.0, "wal_mb_s": 60.0, "ratio": 0.6}],
        "add_block": {"threads": 16, "rate": 12_000.0, "p50_ms": 1.0, "p99_ms": 3.0},
        "recovery": {"rate": 2e6, "records": 10},
        "pipeline": [  # off, on, on, off: the mean per mode
            {"form": "one", "wal": False, "rate": 900.0},
            {"form": "one", "wal": True, "rate": 800.0},
            {"form": "one", "wal": True, "rate": 900.0},
            {"form": "one", "wal": False, "rate": 1100.0},
        ],
    }
    rows = verdicts(results)
    assert [ok for *_, ok in rows] == [False, True, True, True]
    assert rows[-1][1].startswith("0.85")
    assert "| NO |" in render_table(rows)

    # Arrow batches are bounded by the disk: their WAL MB/s is compared with raw 64 MiB writes.
    results["write"].append({"size": 64 << 20, "raw_mb_s": 300.0, "wal_mb_s": 290.0, "ratio": 0.97})
    results["row_bytes"] = 100.0
    results["pipeline"] += [
        {"form": "arrow", "wal": False, "rate": 3e6},
        {"form": "arrow", "wal": True, "rate": 2.4e6},
    ]
    rows = verdicts(results)
    assert rows[-2][0].startswith("receiver throughput, WAL on / off, store(arrow)")
    assert rows[-2][1] == "0.80 (2,400,000 / 3,000,000 rows/s; 240 MB/s of WAL)"
    assert rows[-1][0].startswith("store(arrow) with the WAL on: WAL MB/s / raw fsync MB/s, 64")
    assert rows[-1][1:] == ("0.80 (240 / 300 MB/s)", ">= 0.7", True)


def test_latency_bench_percentiles_and_verdict_rendering():
    from bench.latency_bench import percentile, render_table

    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile(list(range(100)), 0.99) == 99
    table = render_table(
        {"batches": 10, "p50_ms": 40.0, "p99_ms": 90.0},
        [{"batch_ms": 500, "block_ms": 100, "records": 9000, "p50_ms": 950.0, "p99_ms": 1300.0,
          "target_ms": 900, "met": False}],
    )  # fmt: skip
    assert table.splitlines()[-1].endswith("| p50 ≤ 900 ms | NO |")


# -- issue 20: cold start, repeated actions, generated sections only -------------------------------


def test_generated_notes_hold_only_what_the_run_measured():
    notes = throughput_notes([[step("dstream", load_1m=1.0)]])
    assert "hand-written" not in notes and "kept across runs" not in notes


def test_steady_from_is_the_time_after_which_every_delay_stays_under_the_interval():
    from bench.cold_start import steady_from

    def series(*delays: float) -> list[tuple[float, float, float, int]]:
        return [(float(t), d, 500.0, 10) for t, d in enumerate(delays, start=-1)]

    # A batch before the first record (t = -1) does not count; the backlog drains at 3 s.
    assert steady_from(series(5_000, 4_000, 2_500, 1_200, 900, 10, 0), 1000) == 3.0
    assert steady_from(series(0, 0, 0), 1000) == 0.0
    assert steady_from(series(0, 0, 1_500), 1000) == float("inf")  # still behind at the end
    assert steady_from(series(0, 0, 0, 1_200, 0), 1000) == 3.0  # a relapse restarts the clock


def test_connect_startup_target_is_a_range_over_the_repeats_without_the_server_start():
    """Issue 34: Connect's start-up to the first batch ≤ 1.5x the classic session's."""
    from bench.cold_start import ColdRun, render, startup_verdict

    def run(system: str, first_s: float | None, repeat: int, server_s: float = 0.0) -> ColdRun:
        startup = {} if first_s is None else {"first_batch_after_s": first_s}
        extra: dict = {"startup": startup}
        if server_s:
            extra["connect_server"] = {"start_s": server_s}
        return ColdRun(system, 5000, 5.0, 1000.0, [], 0, extra, repeat=repeat)

    classic = [run("spark_receivers", 20.0, 1), run("spark_receivers", 25.0, 2)]
    fast = [run("spark_receivers_connect", x, i, 30.0) for i, x in ((1, 10.0), (2, 12.0))]
    assert startup_verdict([*classic, *fast]).split(": [")[0].endswith("1.5x: met")
    assert "[0.40x, 0.60x]" in startup_verdict([*classic, *fast])  # 10/25 .. 12/20
    slow = [run("spark_receivers_connect", x, i, 30.0) for i, x in ((1, 40.0), (2, 45.0))]
    assert "**not met**: [1.60x, 2.25x]" in startup_verdict([*classic, *slow])
    straddle = [run("spark_receivers_connect", 28.0, 1, 30.0)]  # [1.12x, 1.40x]: met
    assert ": met: " in startup_verdict([*classic, *straddle])
    straddle.append(run("spark_receivers_connect", 33.0, 2, 30.0))  # up to 1.65x
    assert "undecided" in startup_verdict([*classic, *straddle])
    assert startup_verdict([*classic, run("spark_receivers_connect", None, 1)]) == ""
    # The server's 30 s start is a column of its own, in no ratio.
    text = render({"runs": [asdict(r) for r in [*classic, *fast]]})
    assert "| spark_receivers_connect | 1 | 30.0 s | - | - | 10.0 s |" in text


def test_repeated_actions_section_compares_first_and_second_and_judges_the_empty_batch():
    from bench.repeated_actions import render

    cases = [
        {"rate": 100, "cache": True, "batches": 5, "lines_p50": 100.0, "first_p50_ms": 400.0,
         "second_p50_ms": 100.0, "count_p50_ms": 40.0, "batch_p50_ms": 560.0,
         "batch_p99_ms": 700.0, "floor_p50_ms": 80.0},
        {"rate": 0, "cache": True, "batches": 9, "first_p50_ms": 30.0, "second_p50_ms": 0.0,
         "count_p50_ms": 20.0, "batch_p50_ms": 120.0, "batch_p99_ms": 150.0},
    ]  # fmt: skip
    text = render(cases)
    row = "| on | 100 | 5 | 100 | 400 ms | 100 ms | 0.25 | 80 ms | 1.25 | 40 ms | 560 ms / 700 ms |"
    assert row in text
    assert "| on | 9 | 120 ms | 150 ms | **no** |" in text


def test_cpu_sampler_sees_a_busy_thread_and_nothing_outside_its_samples():
    import threading
    import time

    from bench.harness import CpuSampler

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    with CpuSampler(period_s=0.05) as cpu:
        time.sleep(0.2)
        start = time.monotonic()
        spinner = threading.Thread(target=spin)
        spinner.start()
        time.sleep(0.6)
        stop.set()
        spinner.join()
        end = time.monotonic()
        time.sleep(0.2)
    busy = cpu.busy_cores(start, end)
    assert busy is not None
    assert busy > 0.3  # one thread spinning: close to one core unless the machine is full
    assert cpu.busy_cores(start - 3600, end) is None  # before the first sample
    assert cpu.busy_cores(end, start) is None


def _floor_rung(lines: int, wc_ms: float, wc_core_s: float | None) -> dict:
    def figures(p50: float, core_s: float | None) -> dict:
        return {"p50_ms": p50, "min_ms": p50 - 10, "max_ms": p50 + 10, "busy_cores": 1.9,
                "core_s": core_s, "runs": 7}  # fmt: skip

    return {
        "lines": lines,
        "wordcount/cache": figures(wc_ms, wc_core_s),
        "wordcount/checkpoint": figures(wc_ms + 50, wc_core_s),
        "two_action/cache": figures(wc_ms + 100, wc_core_s),
        "two_action/checkpoint": figures(wc_ms + 60, wc_core_s),
    }


def test_query_floor_counts_a_rung_only_when_the_query_leaves_room_in_time_and_cpu():
    from bench.query_floor import fits

    assert fits({"p50_ms": 900.0, "core_s": 1.5})
    assert not fits({"p50_ms": 1000.0, "core_s": 1.0})  # the whole interval
    assert not fits({"p50_ms": 700.0, "core_s": 2.1}, cores=2.0)  # more CPU than the cores
    assert fits({"p50_ms": 700.0, "core_s": None})  # CPU unknown: time alone


def test_query_floor_section_takes_the_faster_form_and_gives_bounds_from_its_rungs():
    from bench.query_floor import render

    rungs = [
        _floor_rung(500_000, 450.0, 0.8),
        _floor_rung(1_000_000, 850.0, 2.4),  # in time, but more CPU than 2 cores have
        _floor_rung(2_000_000, 1_300.0, 2.6),
    ]
    text = render({"cores": 2.0, "runs": 7, "rungs": rungs})
    assert "| 500,000 | wordcount | 450 / 440 | 500 / 490 | 1.90 | 0.80 | yes |" in text
    assert "| 500,000 | two_action | 550 / 540 | 510 / 500 | 1.90 | 0.80 | yes |" in text
    assert "| 1,000,000 | wordcount |" in text and text.count("| no |") == 4
    assert "wordcount: Spark alone fits up to 500,000 lines per 1 s batch, not 1,000,000" in text


def test_query_floor_counts_a_rung_that_either_form_fits():
    from bench.query_floor import best, fits

    rung = _floor_rung(1_000_000, 800.0, 2.1)  # the cache: faster, but over the CPU
    rung["wordcount/checkpoint"]["core_s"] = 1.8  # Spark's own rows: slower, within it
    wc, two = best(rung, "wordcount", cores=2.0), best(rung, "two_action", cores=2.0)
    assert wc["p50_ms"] == 850.0 and fits(wc, cores=2.0)
    assert not fits(two, cores=2.0)


def test_query_floor_gives_the_ladder_the_smallest_batch_spark_alone_did_not_fit():
    from bench.query_floor import lowest_failing

    rungs = [
        _floor_rung(500_000, 450.0, 0.8),
        _floor_rung(1_000_000, 1_050.0, 1.9),  # too slow
        _floor_rung(2_000_000, 1_300.0, 2.6),
    ]
    assert lowest_failing(rungs) == {"wordcount": 1_000_000, "two_action": 1_000_000}
    assert lowest_failing(rungs[:1]) == {}


# -- receiver start -------------------------------------------------------------------------------


def test_receiver_start_lists_the_python_processes_of_a_run_by_their_kind():
    # The kinds are bench/proc_cpu.classify's (tested with the CPU breakdown): the
    # daemons, the workers they fork, the planning workers and the keeper; not this
    # process, nor the JVM.
    assert proc_cpu.DAEMONS in SHOWN and proc_cpu.TASK_WORKERS in SHOWN
    assert proc_cpu.KEEPER in SHOWN and proc_cpu.PLANNER in SHOWN
    assert proc_cpu.DRIVER not in SHOWN and proc_cpu.JVM not in SHOWN
    run = {
        "spark_up_s": 10.04, "start_returned_s": 11.0, "registered_s": 14.5,
        "processes": [
            {"kind": proc_cpu.DAEMONS, "cpu_s": 1.1, "start_s": 12.0, "pid": 1},
            {"kind": proc_cpu.TASK_WORKERS, "cpu_s": 0.2, "start_s": 13.0, "pid": 2},
        ],
    }  # fmt: skip
    assert _row(2, run) == (
        "| 2 | 10.0 | 3.5 | - | 1 PySpark daemons (1.10 CPU-s); 1 other Python task workers "
        "(0.20 CPU-s) |"
    )
