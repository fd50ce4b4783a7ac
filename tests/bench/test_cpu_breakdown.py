"""Pure logic of the CPU breakdown (issue 31): process kinds, windows, stages, flame graphs."""

from __future__ import annotations

import os
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

# bench/ is a top-level directory of the repository, not part of the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import flame, proc_cpu
from bench.cpu_breakdown import JVM_STAGES, Breakdown, _split_by_process, render
from bench.proc_cpu import ProcessInfo, classify, thread_group
from bench.run import SECTIONS, section_argv


def test_processes_are_told_apart_by_what_they_run():
    py = "/venv/bin/python"
    procs = {
        10: ProcessInfo(10, 1, "python", (py, "-m", "bench.receivers", "spark_receivers")),
        11: ProcessInfo(11, 10, "java", ("java", "-cp", "x")),
        12: ProcessInfo(12, 11, "python", (py, "-m", "pyspark.daemon", "pyspark.worker")),
        13: ProcessInfo(13, 12, "python", (py, "-m", "pyspark.daemon", "pyspark.worker")),
        14: ProcessInfo(14, 12, "python", (py, "-m", "pyspark.daemon", "pyspark.worker")),
        15: ProcessInfo(15, 11, "python", (py, "-m", "pyspark.daemon", "pyspark.sql.worker.x")),
        16: ProcessInfo(16, 15, "python", (py, "-m", "pyspark.daemon", "pyspark.sql.worker.x")),
        17: ProcessInfo(17, 1, "python", (py, "-m", "spark_receivers.receiver.block_keeper")),
    }
    kinds = {pid: classify(p, 10, procs, receivers=[13]) for pid, p in procs.items()}
    assert kinds == {
        10: proc_cpu.DRIVER,
        11: proc_cpu.JVM,
        12: proc_cpu.DAEMONS,
        13: proc_cpu.RECEIVER,
        14: proc_cpu.TASK_WORKERS,
        15: proc_cpu.PLANNER,
        16: proc_cpu.PLANNER,
        17: proc_cpu.KEEPER,
    }


def test_jvm_threads_are_grouped_without_their_numbers():
    assert thread_group("GC Thread#3") == "GC Thread"
    assert thread_group("C2 CompilerThre") == "C2 CompilerThre"
    assert thread_group("Executor task l") == "Executor task l"
    assert thread_group("shuffle-client-4-1") == "shuffle-client"


def test_window_cpu_counts_what_each_process_used_inside_it():
    samples = [(0.0, 1.0), (1.0, 2.0), (2.0, 4.0), (3.0, 4.5)]
    assert proc_cpu._used(samples, 1.0, 3.0) == 2.5
    assert proc_cpu._used([(2.0, 0.3), (3.0, 0.5)], 1.0, 3.0) == 0.5  # born in the window
    assert proc_cpu._used([(0.0, 1.0), (1.5, 1.25)], 1.0, 3.0) == 0.25  # ended in it
    assert proc_cpu._used([(4.0, 1.0)], 1.0, 3.0) == 0.0  # not yet born


def test_tree_sampler_sees_this_process_and_its_cpu():
    with proc_cpu.TreeSampler(os.getpid(), period_s=0.05) as tree:
        start = tree.mark()
        n, burnt = 0, time.process_time()
        while time.process_time() - burnt < 0.3:  # CPU, not wall time: the machine is shared
            n += sum(range(20_000))
        end = tree.mark()
        window = tree.window(start, end)
    assert window.by_kind.get(proc_cpu.DRIVER, 0.0) > 0.0
    assert n > 0


def test_a_stack_s_stage_is_its_innermost_frame_a_rule_names():
    rules = [("cache build", ("ColumnBuilder",)), ("read", ("ArrowColumnVector",))]
    build_over_read = ("Executor.run", "CachedRDDBuilder.next", "ColumnBuilder.append", "x")
    read_under_build = ("Executor.run", "ColumnBuilder.next", "ArrowColumnVector.get", "y")
    assert flame.stage_of(build_over_read, rules) == "cache build"
    assert flame.stage_of(read_under_build, rules) == "read"
    assert flame.stage_of(("a", "b"), rules) == "other"
    shares = flame.stage_shares([(build_over_read, 3), (read_under_build, 1)], rules)
    assert shares == {"cache build": 0.75, "read": 0.25}


def test_the_jvm_rules_put_the_cache_build_and_the_arrow_read_apart():
    thread = "thread Executor task launch worker for task"
    build = (
        thread,
        "org.apache.spark.sql.execution.columnar.CachedRDDBuilder$$anon$2.next",
        "org.apache.spark.sql.execution.columnar.compression.DictionaryEncoding$Encoder"
        ".gatherCompressibilityStats",
        "org.apache.spark.unsafe.types.UTF8String.equals",
    )
    read = (thread, "org.apache.spark.sql.execution.columnar.CachedRDDBuilder$$anon$2.next",
            "org.apache.spark.sql.vectorized.ArrowColumnVector.getUTF8String",
            "org.apache.spark.unsafe.types.UTF8String.fromAddress")  # fmt: skip
    assert flame.stage_of(build, JVM_STAGES).startswith("batch cache build")
    assert flame.stage_of(read, JVM_STAGES).startswith("Python data source")


def test_a_task_writing_rows_is_not_taken_for_code_generation():
    """The ingest profile of 2026-11-30 gave 'planning' 46 % of the JVM: mostly a task's
    generated projection writing rows, whose writer lives in a package named codegen."""
    thread = "thread Executor task launch worker for task"
    expr = "org.apache.spark.sql.catalyst.expressions"
    writing = (
        thread,
        f"{expr}.GeneratedClass$GeneratedIteratorForCodegenStage2.processNext",
        f"{expr}.GeneratedClass$SpecificUnsafeProjection.apply",
        f"{expr}.codegen.UnsafeWriter.writeUnalignedBytes",
    )
    compiling = (
        "thread Thread",
        "org.apache.spark.sql.execution.WholeStageCodegenExec.doExecute",
        f"{expr}.codegen.CodeGenerator$.compile",
        "org.codehaus.janino.UnitCompiler.compileUnit",
    )
    cleaning = (
        "thread dag-scheduler-event-loop",
        "org.apache.spark.util.SparkClosureCleaner$.clean",
        "org.apache.xbean.asm9.ClassReader.readUtf",
    )
    assert flame.stage_of(writing, JVM_STAGES).startswith("rows into Spark's row format")
    assert flame.stage_of(compiling, JVM_STAGES).startswith("planning")
    assert flame.stage_of(cleaning, JVM_STAGES).startswith("job submission")


def test_the_flame_graph_is_svg_and_leaves_out_the_smallest_frames():
    stacks = [(("main", "work", "hot"), 990), (("main", "tiny"), 10)]
    svg = flame.render_svg(stacks, "t", min_share=0.02)
    root = ET.fromstring(svg)
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("hot (990 samples") for t in titles)
    assert not any(t.startswith("tiny") for t in titles)
    assert flame.top_frames(stacks, 1) == [("hot", 0.99)]


def test_py_spy_subprocess_stacks_are_split_by_their_innermost_process(tmp_path):
    raw = tmp_path / "workers.txt"
    raw.write_text(
        'process 5:"python -m pyspark.daemon";process 7:"python -m pyspark.daemon";'
        "run (a.py:1);recv (socket.py:2) 4\n"
        'process 5:"python -m pyspark.daemon";manager (daemon.py:3) 1\n'
    )
    split = _split_by_process(raw)
    assert split == {
        7: [(("run (a.py:1)", "recv (socket.py:2)"), 4)],
        5: [(("manager (daemon.py:3)",), 1)],
    }


def test_each_side_counts_against_the_lines_it_handled_and_the_section_says_so():
    b = Breakdown("spark_receivers", "ingest", 100_000, window_s=10.0)
    b.lines, b.lines_processed = 1_000_000, 500_000  # the batches fell behind
    b.by_kind = {proc_cpu.RECEIVER: 0.5, proc_cpu.JVM: 1.0}
    b.spark_alone_core_s_per_batch = 0.05  # 0.5 core-s per million lines
    assert b.kind_per_million(proc_cpu.RECEIVER) == 0.5
    assert b.kind_per_million(proc_cpu.JVM) == 2.0
    assert b.total_per_million == 2.5
    assert b.but_the_query == 2.0
    text = render({"results": [vars(b)]})  # as --from-raw renders it
    assert "| receiver task (Python worker) | 0.50 |" in text
    assert "| **everything but the query** | **2.00** |" in text


def test_the_table_keeps_the_unprofiled_session_s_cpu_and_takes_the_profile_s_stages():
    measured = Breakdown("spark_receivers", "wordcount", 100_000, window_s=10.0)
    measured.lines = measured.lines_processed = 1_000_000
    measured.by_kind = {proc_cpu.JVM: 2.0}
    measured.sustained = True
    profiled = Breakdown("spark_receivers", "wordcount", 100_000, window_s=10.0)
    profiled.by_kind = {proc_cpu.JVM: 9.0}  # the profilers' own cost, not the pipeline's
    profiled.jvm_stages = {"query operators (split, explode, aggregate, count)": 0.5}
    profiled.graphs = ["bench/results/cpu-latest-spark_receivers-wordcount-jvm.svg"]
    measured.take_profile(profiled)
    assert measured.kind_per_million(proc_cpu.JVM) == 2.0
    assert measured.graphs == profiled.graphs and measured.profiled_sustained is False
    text = render({"results": [vars(measured)]})
    assert "query operators (split, explode, aggregate, count) 50% (1.00)" in text
    assert "| step sustained | yes |" in text and "| profiled session sustained | no |" in text


def test_the_section_runs_in_make_bench_before_the_ladder():
    order = list(SECTIONS)
    assert order.index("query_floor") < order.index("cpu_breakdown") < order.index("throughput")
    assert section_argv("cpu_breakdown", quick=True, output="o.md", no_write=True) == [
        "--quick", "--output", "o.md", "--no-write",
    ]  # fmt: skip


def test_every_system_is_one_its_benchmark_child_runs():
    """A system name the child module does not know would fail only after a JVM start."""
    import importlib

    from bench.cpu_breakdown import SYSTEMS

    for system, module in SYSTEMS.items():
        assert system in importlib.import_module(module).PIPELINES, (system, module)
