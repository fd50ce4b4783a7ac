"""Where the CPU goes: CPU-seconds per million lines per process and per stage, ours and DStream's.

    python -m bench.cpu_breakdown                       # 2 systems x 2 pipelines, ~5 minutes
    python -m bench.cpu_breakdown --rate 200000 --seconds 25 --tag before --no-write
    python -m bench.cpu_breakdown --systems spark_receivers --pipelines ingest --no-profile
    python -m bench.cpu_breakdown --pipelines two_action --no-write \\
        --systems spark_receivers,spark_receivers_connect      # issue 34: classic vs Connect

Issue 31: what receiving and reading a batch cost, measured per process and per stage
before cutting anything. Each system (``spark_receivers``: our ``SocketTextReceiver``;
``dstream``: ``socketTextStream``) runs each pipeline (``ingest``: a line count;
``wordcount``: the ladder's word count; ``two_action`` on request) at **one fixed rate**
(the same for both, ``--rate``) for ``--seconds``, through the ladder's own session
(``bench.step.run_child_session``: the same line server of 100-byte lines, child process,
``local[4]``, 1 s batches, warm-up). A sampler reads the CPU of every process of the
child's tree from ``/proc`` every 0.25 s (``bench/proc_cpu.py``); the window starts
``--settle`` seconds (default ``SETTLE_S``, 30 s) after the receiver connected, and ends a
second before the send window does. A JVM planning one batch a second keeps compiling for
minutes (2026-12-01, 600,000 lines/s: its compilers ran 84 ms/s 50 s after the JVM
started and 5-24 ms/s after seven minutes and more), so a short settle counts part of the
JIT's warm-up; a steadier state needs ``--settle 150`` or more and ``--seconds`` beyond
it. The JVM's JIT compiler threads are counted in the JVM and also shown on a line of
their own.
Per million lines offered in the window it prints each process kind's CPU-seconds: the
child's Python (the driver: our scheduler, tracker and batch threads; DStream's
py4j callbacks), the JVM (driver and executor in one, ``local[4]``) with its threads by
name, our block keeper, our receiver's task (the Python worker holding the connection), the
other Python task workers (ours: the data source's read tasks; DStream's: its Python
``flatMap``/``map``), the data source's planning workers.

The profiles come from a **second session** of each step, so that the table's CPU figures
are those of a session no profiler touched: under py-spy and JFR the JVM's compilers still
ran at 2.9-4.3 core-s per million lines 30 s in (150,000 lines/s, 2026-11-30) and our word
count fell behind. A stage's core-seconds are its share of the profiled session's samples
times the unprofiled session's JVM figure. Inside the JVM, Java Flight Recorder (``jcmd
<pid> JFR.start``, the JDK's ``jfr print``) samples the Java threads over the same window;
each sample's stage is its innermost frame that a rule of :data:`JVM_STAGES` names. Inside
our Python processes py-spy samples the receiver's task, the keeper, the read workers and
the driver. py-spy is meant to leave
idle threads out, but on the machines of 2026-11-25 it did not (threads blocked in
``recv`` or a socket read were sampled as working), so a Python graph shows where threads
are, not only where CPU goes; the stage shares leave out Python-level waits (locks,
events, queues), and ``--gil`` samples only the thread holding the GIL (Python code's CPU,
without native work done outside the GIL: ``recv``, Arrow kernels, gRPC). ``/proc`` gives
each process's CPU. Flame graphs (SVG, frames under 1 % of the samples left out) go to
``bench/results/cpu-<tag>-<system>-<pipeline>-<process>.svg``.

Spark alone (``query_floor``'s method, CPU from ``/proc`` instead of the machine's busy
cores): the pipeline's query on a batch of the same size already in Spark's memory
(``local[4]``, 4 partitions), in a child process of its own, after the same JIT warm-up as
``query_floor``'s (``SPARK_ALONE_WARM_S`` of word counts), then once a second as the
stream's batches run for the same ``--settle`` as the stream's window (since 2026-12-01),
then ``runs`` measured runs back to back: the query's CPU, with as little of the JVM's
background as can be (that is counted against the stream). The rows are held in both of
``query_floor``'s forms (cache, local checkpoint) and the cheaper one counts.
"Everything but the query" is the system's CPU per million lines minus Spark alone's. It is
a difference of two processes' figures: read it beside the Python processes' own CPU
(receiver, keeper, read tasks, driver), which is all outside the query.

The machine may be shared: CPU-seconds per process count only this benchmark's processes,
but a busy machine slows everything (and more context switches cost more). The machine's
busy cores over the window (``/proc/stat``, every process) are printed next to the tree's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import flame, proc_cpu
from bench.harness import CpuSampler
from bench.profile_summary import parse_collapsed
from bench.record import Recording, Section, add_record_arguments, doc_tail
from bench.step import REPO_ROOT, run_child_session

__all__ = ["JVM_STAGES", "SECTION", "Breakdown", "main", "render", "run_breakdown"]

SYSTEMS = {
    "spark_receivers": "bench.receivers",
    "dstream": "bench.peers",
    "spark_receivers_nocache": "bench.receivers",  # batch cache off (not in the default run)
    # Parquet spool read by Spark's reader, decision 0026 (not in the default run)
    "spark_receivers_parquetspool": "bench.receivers",
    "spark_receivers_wal": "bench.receivers",  # receiver WAL on (not in the default run)
    # Through a Spark Connect server (issue 34; not in the default run): the child is the
    # client, its JVM the server's (started by the child), the tracker in the child's Python.
    "spark_receivers_connect": "bench.receivers",
}
DEFAULT_SYSTEMS = ("spark_receivers", "dstream")
PIPELINES = ("ingest", "wordcount")
DEFAULT_RATE = 150_000
DEFAULT_SECONDS = 60.0
QUICK_RATE = 100_000
QUICK_SECONDS = 16.0
SETTLE_S = 30.0
"""The window starts this long after the receiver connected (first blocks, JIT): a fresh
JVM's compilers still took 0.3-0.7 core-s per million lines 8-38 s after the connection
at 450,000 lines/s on 2026-11-30 (``jstat -compiler``: 160 compilations/s, tapering), a
start-up cost a ladder's minutes-long sessions do not carry. A session shorter than
``SETTLE_S + 10`` s (``--quick``) settles ``QUICK_SETTLE_S``."""
QUICK_SETTLE_S = 8.0
SPARK_ALONE_WARM_S = 20.0
"""Spark alone warms up as ``bench.query_floor`` does (word counts on a million lines for
this long) before it is measured: with four queries only, its JIT was still compiling and
it came out 1.3x query_floor's figure (2026-11-29)."""
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
SPARK_ALONE_RUNS = 8
SPARK_ALONE_INTERVAL_S = 1.0
"""Spark alone's settling queries start this far apart, as the stream's 1 s batches do."""
RESULTS_DIR = REPO_ROOT / "bench" / "results"
SPARK_ALONE_PREFIX = "SPARK_ALONE "
PYSPY_RATE = 67  # samples/s per process: a few % of a core for py-spy, little in the target

JVM_STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "DStream receiver (socket read, lines into blocks)",
        ("streaming.receiver.", "streaming.dstream.SocketReceiver", "SocketInputDStream",
         "thread Socket Receiver"),
    ),
    (
        "batch cache build (columnar, compression)",
        ("columnar.compression.", "columnar.CachedRDDBuilder", "DefaultCachedBatchSerializer",
         "columnar.BasicColumnBuilder", "columnar.NativeColumnBuilder",
         "columnar.NullableColumnBuilder", "columnar.ComplexColumnBuilder",
         "columnar.ColumnStats", "columnar.StringColumnStats", "columnar.ColumnBuilder"),
    ),
    (
        "batch cache read",
        ("columnar.ColumnAccessor", "columnar.BasicColumnAccessor", "InMemoryTableScanExec",
         "columnar.NativeColumnAccessor", "SpecificColumnarIterator",
         "columnar.NullableColumnAccessor"),
    ),
    (
        "Python data source: Arrow from the worker into rows",
        ("vectorized.ArrowColumnVector", "org.apache.arrow.", "python.PythonArrowOutput",
         "vectorized.ColumnarBatchRow", "python.ArrowOutput", "PythonPartitionReaderFactory",
         "python.PythonDataSource", "python.MapInBatch", "python.BasePythonRunner$ReaderIterator",
         "python.PythonArrowInput", "ArrowPythonRunner"),
    ),
    (
        # The generated projections that copy each row a read (or a stage) gives into
        # Spark's row format run in the tasks: before 2026-11-30 the planning rule's
        # "expressions.codegen." took their writer's frames for code generation.
        "rows into Spark's row format (generated projections, UnsafeRow writers)",
        ("codegen.UnsafeWriter", "codegen.UnsafeRowWriter", "codegen.UnsafeArrayWriter",
         "codegen.BufferHolder", "GeneratedClass$SpecificUnsafeProjection"),
    ),
    (
        "Python RDD (rows to and from Python workers)",
        ("api.python.PythonRunner", "api.python.PythonRDD", "api.python.SerDeUtil",
         "api.python.BasePythonRunner", "net.razorvine.pickle"),
    ),
    (
        "shuffle",
        ("org.apache.spark.shuffle.", "ShuffleExternalSorter", "UnsafeShuffleWriter",
         "ShuffleBlockFetcherIterator", "util.collection.ExternalSorter",
         "util.collection.PartitionedAppendOnlyMap", "unsafe.sorter."),
    ),
    (
        "query operators (split, explode, aggregate, count)",
        ("GeneratedIteratorForCodegenStage", "aggregate.HashAggregateExec",
         "UnsafeFixedWidthAggregationMap", "execution.GenerateExec", "unsafe.map.BytesToBytesMap",
         "aggregate.TungstenAggregationIterator", "expressions.GeneratedClass$SpecificPredicate"),
    ),
    ("block manager, memory store", ("org.apache.spark.storage.", "org.apache.spark.memory.")),
    (
        "serialization (Java, Kryo)",
        ("org.apache.spark.serializer.", "com.esotericsoftware.kryo", "java.io.ObjectOutputStream",
         "java.io.ObjectInputStream"),
    ),
    ("py4j (driver Python to the JVM)", ("py4j.",)),
    (
        "job submission (closures, DAG, tasks), RPC, listeners",
        ("SparkContext.clean", "util.ClosureCleaner", "util.SparkClosureCleaner", "xbean.asm",
         "org.apache.spark.scheduler.",
         "org.apache.spark.rpc.", "io.netty.", "org.sparkproject.io.netty.",
         "org.apache.spark.network.", "util.ListenerBus", "org.apache.spark.executor."),
    ),
    (
        "planning (analysis, optimization, codegen)",
        ("sql.catalyst.analysis.", "sql.catalyst.optimizer.", "sql.catalyst.rules.",
         "sql.catalyst.planning.", "sql.catalyst.trees.", "expressions.codegen.",
         "catalyst.plans.", "codehaus.", "sql.execution.QueryExecution",
         "sql.execution.SparkStrategies", "sql.execution.adaptive.",
         "sql.execution.CacheManager"),
    ),
)  # fmt: skip
"""A JVM sample's stage is its innermost frame that one of these patterns is in."""

WAITING = "waiting (locks, events, sleeps)"
PY_STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("socket recv", ("recv (",)),
    ("lines → Arrow (split, UTF-8 check)", ("split_lines", "split_pattern", "cast (")),
    ("Flight put to the keeper (client)", ("put_table",)),
    ("Flight put (server: read, store)", ("do_put", "_put (block_keeper")),
    ("Flight get (server)", ("do_get", "_read (block_keeper")),
    ("Flight read of blocks (client)", ("read_table", "fetch_block")),
    (
        "block cut, concat, Arrow conversion",
        ("push_cut_block", "records_to_table", "concat_tables"),
    ),
    ("block reports, control calls", ("AddBlocks", "_send (block_reporter", "call (transport")),
    ("store() into the generator", ("add_table", "add_data", "add_many", "store (receiver")),
    (
        "data source read → Arrow batches to the JVM",
        ("read (block_source", "conform", "to_batches"),
    ),
    ("PySpark worker I/O", ("pyspark/worker", "serializers", "worker.py")),
    (WAITING, ("wait (threading", "_wait_for_tstate_lock", "sleep", "get (queue")),
)
"""A Python sample's stage (py-spy frames read ``function (file:line)``)."""


@dataclass
class Breakdown:
    """One (system, pipeline) at one rate: CPU per process kind and per stage."""

    system: str
    pipeline: str
    rate: int
    window_s: float = 0.0
    window: tuple[float, float] = (0.0, 0.0)
    settle_s: float | None = None
    """How long after the receiver connected the window started (None: raw files of before
    2026-12-01, which settled ``SETTLE_S``)."""
    lines: float = 0.0
    """Lines the line server sent in the window (what the receiver read)."""
    lines_processed: float = 0.0
    """Lines of the batches that completed in the window (what the batch side did)."""
    sustained: bool = False
    reason: str = ""
    by_kind: dict[str, float] = field(default_factory=dict)
    jvm_threads: dict[str, float] = field(default_factory=dict)
    jvm_stages: dict[str, float] = field(default_factory=dict)
    py_stages: dict[str, dict[str, float]] = field(default_factory=dict)
    py_top: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    jvm_top: list[tuple[str, float]] = field(default_factory=list)
    machine_busy_cores: float | None = None
    spark_alone_core_s_per_batch: float | None = None
    graphs: list[str] = field(default_factory=list)
    profiled_sustained: bool | None = None
    """Whether the profiled session of this step kept up (None: not profiled)."""
    pids: dict[str, list[int]] = field(default_factory=dict)
    """The pids of each kind seen, and the daemon whose workers py-spy followed."""
    error: str | None = None

    def take_profile(self, profiled: Breakdown) -> None:
        """Take the stages, top frames and graphs of a profiled session of the same step.

        The CPU figures stay this (unprofiled) session's: py-spy and JFR cost CPU in the
        processes they sample, and under them the JVM's compilers ran at 2.9-4.3 core-s per
        million lines 30 s in (150,000 lines/s, 2026-11-30) and the word count fell behind.
        """
        self.jvm_stages, self.py_stages = profiled.jvm_stages, profiled.py_stages
        self.jvm_top, self.py_top, self.graphs = profiled.jvm_top, profiled.py_top, profiled.graphs
        self.profiled_sustained = profiled.sustained
        if profiled.error and not self.error:
            self.error = f"profiled session: {profiled.error}"

    def per_million(self, core_s: float, kind: str = proc_cpu.JVM) -> float:
        """``core_s`` per million lines: lines read for the receiver side, else processed.

        The two are the same in a sustained step; when the batches fall behind, each side
        is counted against the lines it handled.
        """
        receiving = kind in (proc_cpu.RECEIVER, proc_cpu.KEEPER)
        lines = self.lines if receiving or not self.lines_processed else self.lines_processed
        return core_s / lines * 1e6 if lines else 0.0

    def kind_per_million(self, kind: str) -> float:
        return self.per_million(self.by_kind.get(kind, 0.0), kind)

    @property
    def total_per_million(self) -> float:
        return sum(self.kind_per_million(k) for k in self.by_kind)

    @property
    def total(self) -> float:
        return sum(self.by_kind.values())

    @property
    def but_the_query(self) -> float | None:
        """Everything but the query: all CPU per million lines minus Spark alone's."""
        alone = self.spark_alone_per_million
        return None if alone is None else self.total_per_million - alone

    @property
    def spark_alone_per_million(self) -> float | None:
        s = self.spark_alone_core_s_per_batch
        return None if s is None else s / self.rate * 1e6


# -- one run --------------------------------------------------------------------------------


def _find_child(module: str, system: str, timeout_s: float) -> tuple[int, int] | None:
    """The benchmark child this process started for ``system``, and its line server port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for info in proc_cpu.descendants(os.getpid()).values():
            args = info.cmdline
            if module in args and system in args and "--port" in args:
                return info.pid, int(args[args.index("--port") + 1])
        time.sleep(0.1)  # a process of another's making: nothing to wait on
    return None


class _Profilers:
    """JFR in the JVM and py-spy on chosen Python processes, over one window."""

    def __init__(self, workdir: Path, gil: bool = False) -> None:
        self.workdir = workdir
        self.gil = gil
        self.jvm: int | None = None
        self.spies: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def start(self, jvm: int | None, python: dict[str, tuple[int, bool]], seconds: float) -> None:
        """Start JFR in ``jvm`` and py-spy on each ``name: (pid, with subprocesses)``."""
        if jvm is not None:
            done = subprocess.run(
                ["jcmd", str(jvm), "JFR.start", "name=cpu31", "settings=profile"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if done.returncode == 0 and "Started recording" in done.stdout:
                self.jvm = jvm
            else:
                print(f"JFR did not start: {done.stdout.strip()} {done.stderr.strip()}")
        spy = Path(sys.executable).with_name("py-spy")
        for name, (pid, subprocesses) in python.items():
            out = self.workdir / f"{name}.txt"
            cmd = [str(spy), "record", "--pid", str(pid), "--duration", str(int(seconds)),
                   "--rate", str(PYSPY_RATE), "--format", "raw",
                   "--output", str(out)]  # fmt: skip
            if subprocesses:
                cmd.append("--subprocesses")
            if self.gil:
                cmd.append("--gil")
            self.spies[name] = (
                subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE),
                out,
            )

    def stop(self) -> tuple[Path | None, dict[str, Path]]:
        """Stop JFR (its file) and wait for py-spy (the raw files that were written)."""
        jfr: Path | None = None
        if self.jvm is not None:
            path = self.workdir / "jvm.jfr"
            subprocess.run(
                ["jcmd", str(self.jvm), "JFR.dump", "name=cpu31", f"filename={path}"],
                capture_output=True, timeout=120, check=False,
            )  # fmt: skip
            subprocess.run(
                ["jcmd", str(self.jvm), "JFR.stop", "name=cpu31"],
                capture_output=True, timeout=60, check=False,
            )  # fmt: skip
            jfr = path if path.exists() else None
        raw: dict[str, Path] = {}
        for name, (proc, out) in self.spies.items():
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if out.exists():
                raw[name] = out
            else:
                print(f"py-spy on {name} wrote nothing: {err.decode(errors='replace')[-300:]}")
        return jfr, raw


def _split_by_process(path: Path) -> dict[int, list[flame.Stack]]:
    """py-spy ``--subprocesses`` raw stacks per pid (their root frame is ``process N:...``)."""
    out: dict[int, list[flame.Stack]] = {}
    with open(path) as f:
        for frames, n in parse_collapsed(f):
            pid = -1
            # Nested: the daemon's frame, then its forked worker's; the last one is the process.
            while frames and frames[0].startswith("process "):
                with contextlib.suppress(ValueError, IndexError):
                    pid = int(frames[0].split(":", 1)[0].split()[1])
                frames = frames[1:]
            out.setdefault(pid, []).append((tuple(frames), n))
    return out


def _monitor(
    b: Breakdown,
    module: str,
    seconds: float,
    profile: bool,
    tag: str,
    cpu: CpuSampler,
    gil: bool = False,
    settle: float = SETTLE_S,
) -> None:
    """Find the child, sample its tree over the window, profile it; fill ``b``."""
    found = _find_child(module, b.system, 120)
    if found is None:
        b.error = "the benchmark child did not appear"
        return
    child, port = found
    with proc_cpu.TreeSampler(child, port) as tree:
        connected = tree.wait_connected(240)
        if connected is None:
            b.error = "the receiver never connected"
            return
        b.settle_s = settle if seconds >= settle + 10 else QUICK_SETTLE_S
        start = connected + b.settle_s
        end = connected + seconds - 1.0
        time.sleep(max(0.0, start - time.monotonic()))
        start = tree.mark()
        workdir = Path(tempfile.mkdtemp(prefix="cpu31-"))
        profilers = _Profilers(workdir, gil)
        targets: dict[str, tuple[int, bool]] = {}
        if profile:
            jvms = tree.pids_of(proc_cpu.JVM)
            targets["driver"] = (child, False)
            keepers = tree.pids_of(proc_cpu.KEEPER)
            if keepers:
                targets["keeper"] = (min(keepers), False)
            if tree.receivers:
                targets["receiver"] = (tree.receivers[0], False)
            # Every daemon of task workers, followed into its workers (the receiver's stacks
            # there are left out: it has a py-spy of its own).
            for i, daemon in enumerate(tree.pids_of(proc_cpu.DAEMONS)):
                info = tree.info(daemon)
                if info is not None and "pyspark.sql.worker" not in " ".join(info.cmdline):
                    targets[f"workers{i}"] = (daemon, True)
            profilers.start(jvms[0] if jvms else None, targets, end - start)
        time.sleep(max(0.0, end - time.monotonic()))
        end = tree.mark()
        window = tree.window(start, end)
        receivers = set(tree.receivers)
        b.pids = {kind: tree.pids_of(kind) for kind in proc_cpu.KINDS}
        b.pids["followed daemons"] = [p for n, (p, _) in targets.items() if n.startswith("workers")]
    b.window_s = end - start
    b.window = (start, end)
    b.by_kind = window.by_kind
    b.jvm_threads = window.jvm_threads
    time.sleep(0.6)
    b.machine_busy_cores = cpu.busy_cores(start, end)
    if profile:
        jfr, raw = profilers.stop()
        _read_profiles(b, jfr, raw, receivers, tag)


def _read_profiles(
    b: Breakdown, jfr: Path | None, raw: dict[str, Path], receivers: set[int], tag: str
) -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = f"cpu-{tag}-{b.system}-{b.pipeline}"

    def graph(name: str, stacks: list[flame.Stack], title: str) -> None:
        if not stacks:
            return
        path = RESULTS_DIR / f"{stem}-{name}.svg"
        path.write_text(flame.render_svg(stacks, title, min_share=0.01))
        b.graphs.append(str(path.relative_to(REPO_ROOT)))

    if jfr is not None:
        samples = flame.jfr_stacks(jfr)
        stacks = flame.collapse(frames for frames, _ in samples)
        b.jvm_stages = flame.stage_shares(stacks, JVM_STAGES)
        b.jvm_top = flame.top_frames(stacks)
        graph("jvm", stacks, f"{b.system} {b.pipeline} at {b.rate:,}/s: JVM (JFR)")
    groups: dict[str, list[flame.Stack]] = {}
    for name, path in raw.items():
        if name.startswith("workers"):
            for pid, stacks in _split_by_process(path).items():
                if pid not in receivers:  # profiled on its own
                    groups.setdefault("task_workers", []).extend(stacks)
        else:
            with open(path) as f:
                groups[name] = [(tuple(fr), n) for fr, n in parse_collapsed(f)]
    for name, stacks in groups.items():
        # A thread waiting on a lock or an event is not working (py-spy's idle filter lets
        # Python-level waits through): its samples are left out of the shares.
        working = [(fr, n) for fr, n in stacks if flame.stage_of(fr, PY_STAGES) != WAITING]
        b.py_stages[name] = flame.stage_shares(working, PY_STAGES)
        b.py_top[name] = flame.top_frames(stacks, 8)
        graph(name, stacks, f"{b.system} {b.pipeline} at {b.rate:,}/s: {name} (py-spy)")


def run_breakdown(
    system: str,
    pipeline: str,
    rate: int,
    seconds: float,
    *,
    profile: bool,
    tag: str,
    gil: bool = False,
    settle: float = SETTLE_S,
) -> Breakdown:
    """One session of ``system`` at ``rate`` for ``seconds``, measured and profiled."""
    module = SYSTEMS[system]
    b = Breakdown(system, pipeline, rate)
    with CpuSampler() as cpu:
        monitor = threading.Thread(
            target=_monitor,
            args=(b, module, seconds, profile, tag, cpu, gil, settle),
            daemon=True,
        )
        monitor.start()
        session = run_child_session(system, module, [rate], seconds, pipeline=pipeline)
        monitor.join(300 + settle)
    step = session.steps[0]
    b.sustained, b.reason = step.sustained, step.reason
    b.lines = step.sent_rate * b.window_s
    b.lines_processed = _processed_in(step.extra.get("raw"), *b.window)
    if step.error and not b.error:
        b.error = step.error
    return b


def _processed_in(raw: object, start: float, end: float) -> float:
    """Lines of the batches that completed within ``[start, end]``, from the session's raw file."""
    if not isinstance(raw, str):
        return 0.0
    try:
        batches = json.loads((REPO_ROOT / raw).read_text()).get("batches", [])
    except (OSError, ValueError):
        return 0.0
    done = [b for b in batches if start <= b.get("completed_s", -1) <= end]
    return float(sum(b.get("lines", 0) for b in done))


# -- Spark alone -----------------------------------------------------------------------------


def spark_alone(pipeline: str, lines: int, runs: int, settle_s: float = 0.0) -> float:
    """CPU-seconds of this process tree per run of ``pipeline``'s query on ``lines`` in memory.

    The rows are held in both of ``query_floor``'s forms (a cache, a local checkpoint) and
    the cheaper form counts: the lower Spark alone's figure, the stricter the "everything
    but the query" derived from it (on 2026-11-30 the cache form cost 1.3-1.6x the
    checkpoint form's wall time at 432,000 lines).

    After ``query_floor``'s warm-up the query runs as a stream's batches do, once a batch
    interval (:data:`SPARK_ALONE_INTERVAL_S`), for ``settle_s`` seconds (the two forms in
    turn): the JVM is then about as far into its JIT warm-up as the stream's was when its
    window opened (a JVM planning a batch a second compiles for minutes; decision 0011,
    "The steady state"). The ``runs`` measured runs of each form then go back to back, so
    that the figure is the query's and holds as little of the JVM's background between
    queries (compilers, GC, heartbeats) as can be: that background is counted against
    the stream, which is the stricter judge. Measured runs paced once a second, as they
    were for a few hours on 2026-12-01, gave Spark alone that second of background per
    run: 0.30-0.35 core-s per million lines against 0.24-0.27 back to back at 600,000
    lines, and 1.45-1.97 at 150,000 lines with a 30 s settle, which made "everything but
    the query" negative.
    """
    from bench.child import local_session
    from bench.pipelines import batch_query
    from bench.query_floor import lines_table, warm_up
    from spark_receivers.receivers.lines import BLOCK_LINES, LinePool

    query = batch_query(pipeline)
    spark = local_session("cpu-breakdown-spark-alone")
    try:
        warm_up(spark, LinePool(), SPARK_ALONE_WARM_S)
        n = max(BLOCK_LINES, lines // BLOCK_LINES * BLOCK_LINES)
        base = spark.createDataFrame(lines_table(LinePool(), n)).repartition(4)
        cached = base.cache()
        cached.count()
        frames = [cached, base.localCheckpoint(eager=True)]
        for df in frames:
            for _ in range(4):  # warm: Python workers, the first shuffle of this form
                query(df)
        settle_runs = int(settle_s / SPARK_ALONE_INTERVAL_S)
        _paced(settle_runs, lambda i: query(frames[i % len(frames)]))
        costs = []
        for df in frames:
            with proc_cpu.TreeSampler(os.getpid()) as tree:
                start = tree.mark()
                for _ in range(runs):
                    query(df)
                end = tree.mark()
                costs.append(tree.window(start, end).total / runs * lines / n)
        cached.unpersist(blocking=True)
        return min(costs)
    finally:
        spark.stop()


def _paced(runs: int, run: Callable[[int], object]) -> None:
    """``run(i)`` for ``i < runs``, each starting a batch interval after the one before
    (right after it when it took longer)."""
    t0 = time.monotonic()
    for i in range(runs):
        time.sleep(max(0.0, t0 + i * SPARK_ALONE_INTERVAL_S - time.monotonic()))
        run(i)
    time.sleep(max(0.0, t0 + runs * SPARK_ALONE_INTERVAL_S - time.monotonic()))


def run_spark_alone(
    pipeline: str, lines: int, runs: int = SPARK_ALONE_RUNS, settle_s: float = 0.0
) -> float | None:
    """:func:`spark_alone` in a child process of its own (a fresh JVM); None if it failed."""
    cmd = [sys.executable, "-m", "bench.cpu_breakdown", "--spark-alone", pipeline,
           "--lines", str(lines), "--runs", str(runs), "--settle", str(settle_s)]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900 + 2 * settle_s,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith(SPARK_ALONE_PREFIX):
            return float(json.loads(line[len(SPARK_ALONE_PREFIX) :])["core_s_per_batch"])
    print(f"Spark alone ({pipeline}) failed: {(done.stderr or done.stdout)[-1500:]}")
    return None


# -- report ------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def breakdowns(data: dict[str, Any]) -> list[Breakdown]:
    """The run's breakdowns from its raw data (JSON: tuples came back as lists)."""
    out = []
    for d in data["results"]:
        b = Breakdown(**{k: v for k, v in d.items() if k in Breakdown.__dataclass_fields__})
        b.window = tuple(b.window)  # type: ignore[assignment]
        b.jvm_top = [tuple(x) for x in b.jvm_top]  # type: ignore[misc]
        b.py_top = {k: [tuple(x) for x in v] for k, v in b.py_top.items()}  # type: ignore[misc]
        out.append(b)
    return out


def render(data: dict[str, Any]) -> str:
    """The ``cpu_breakdown`` section's body from a run's raw data."""
    results = breakdowns(data)
    cols = [f"{b.system} {b.pipeline}" for b in results]
    rows = [
        "| core-s per million lines | " + " | ".join(cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]

    def row(label: str, cells: Sequence[str]) -> None:
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    for kind in proc_cpu.KINDS:
        if any(b.by_kind.get(kind) for b in results):
            row(kind, [_f(b.kind_per_million(kind)) for b in results])
    row("**all processes**", [f"**{_f(b.total_per_million)}**" for b in results])
    row(
        "of which the JVM's JIT compilers (C1, C2)",
        [_f(b.per_million(sum(b.jvm_threads.get(t, 0.0) for t in JIT_THREADS)))
         for b in results],
    )  # fmt: skip
    row("Spark alone, same query and batch", [_f(b.spark_alone_per_million) for b in results])
    row("**everything but the query**", [f"**{_f(b.but_the_query)}**" for b in results])
    row(
        "window (s), from (s after the connection); lines read, processed in it",
        [
            f"{b.window_s:.1f}, {_f(b.settle_s, '.0f')}; {b.lines:,.0f}, {b.lines_processed:,.0f}"
            for b in results
        ],
    )
    row(
        "tree's busy cores / machine's",
        [f"{_f(b.total / b.window_s if b.window_s else None)} / {_f(b.machine_busy_cores)}"
         for b in results],
    )  # fmt: skip
    row("step sustained", ["yes" if b.sustained else f"no ({b.reason[:60]})" for b in results])
    if any(b.profiled_sustained is not None for b in results):
        row(
            "profiled session sustained",
            ["-" if b.profiled_sustained is None else "yes" if b.profiled_sustained else "no"
             for b in results],
        )  # fmt: skip
    parts = ["\n".join(rows)]
    for b in results:
        parts.append(_render_detail(b))
    return "\n\n".join(parts)


def _render_detail(b: Breakdown) -> str:
    lines = [f"### {b.system}, {b.pipeline}, {b.rate:,} lines/s"]
    if b.error:
        lines.append(f"\nError: {b.error[:300]}")
    threads = sorted(b.jvm_threads.items(), key=lambda kv: -kv[1])[:8]
    if threads:
        lines.append(
            "\nJVM threads (core-s per million lines): "
            + ", ".join(f"{name} {b.per_million(v):.2f}" for name, v in threads)
        )
    if b.jvm_stages:
        jvm = b.kind_per_million(proc_cpu.JVM)
        lines.append(
            "\nJVM Java threads by stage (JFR; share of samples, and that share of the JVM's "
            "core-s per million lines): "
            + "; ".join(
                f"{k} {v:.0%} ({v * jvm:.2f})" for k, v in b.jvm_stages.items() if v >= 0.01
            )
        )
        lines.append(
            "\nJVM hottest frames: " + ", ".join(f"`{k}` {v:.0%}" for k, v in b.jvm_top[:8])
        )
    for name, shares in b.py_stages.items():
        lines.append(
            f"\nPython {name} by stage (py-spy): "
            + "; ".join(f"{k} {v:.0%}" for k, v in shares.items() if v >= 0.02)
        )
    if b.graphs:
        lines.append("\nFlame graphs: " + ", ".join(f"`{g}`" for g in b.graphs))
    return "\n".join(lines)


SECTION = Section(
    name="cpu_breakdown",
    module="bench.cpu_breakdown",
    title="Where the CPU goes: core-seconds per million lines (issue 31)",
    render=render,
    about=doc_tail(__doc__),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.cpu_breakdown", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help=f"{QUICK_RATE:,}/s, {QUICK_SECONDS} s")
    p.add_argument("--rate", type=int, help=f"lines/s (default {DEFAULT_RATE:,})")
    p.add_argument("--seconds", type=float, help=f"per session (default {DEFAULT_SECONDS})")
    p.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help=f"the window starts this long after the receiver connected (default {SETTLE_S:.0f})",
    )
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"from {sorted(SYSTEMS)}")
    p.add_argument("--pipelines", default=",".join(PIPELINES), help="ingest,wordcount,two_action")
    p.add_argument("--no-profile", action="store_true", help="CPU per process only")
    p.add_argument("--gil", action="store_true", help="py-spy samples only the GIL's holder")
    p.add_argument("--tag", default="latest", help="names the flame graphs (before, after...)")
    add_record_arguments(p)
    p.add_argument("--spark-alone", metavar="PIPELINE", help=argparse.SUPPRESS)
    p.add_argument("--lines", type=int, help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=SPARK_ALONE_RUNS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.spark_alone:
        core_s = spark_alone(args.spark_alone, args.lines, args.runs, args.settle)
        print(SPARK_ALONE_PREFIX + json.dumps({"core_s_per_batch": core_s}), flush=True)
        return 0
    rate = args.rate or (QUICK_RATE if args.quick else DEFAULT_RATE)
    seconds = args.seconds or (QUICK_SECONDS if args.quick else DEFAULT_SECONDS)
    systems = [s for s in args.systems.split(",") if s]
    pipelines = [x for x in args.pipelines.split(",") if x]
    if not set(systems) <= set(SYSTEMS):
        p.error(f"--systems must be from {sorted(SYSTEMS)}")
    results = []
    alone: dict[str, float | None] = {}
    with Recording(SECTION, "python -m bench.cpu_breakdown", argv, args) as rec:
        for pipeline in pipelines:
            for system in systems:
                b = run_breakdown(
                    system, pipeline, rate, seconds, profile=False, tag=args.tag, settle=args.settle
                )
                if not args.no_profile:
                    profiled = run_breakdown(
                        system,
                        pipeline,
                        rate,
                        seconds,
                        profile=True,
                        tag=args.tag,
                        gil=args.gil,
                        settle=args.settle,
                    )
                    b.take_profile(profiled)
                if pipeline not in alone:
                    settled = b.settle_s if b.settle_s is not None else args.settle
                    alone[pipeline] = run_spark_alone(pipeline, rate, settle_s=settled)
                b.spark_alone_core_s_per_batch = alone[pipeline]
                results.append(b)
                print(_render_detail(b), flush=True)
                print(
                    f"all processes {b.total_per_million:.2f} core-s per million lines; by kind: "
                    + ", ".join(
                        f"{k} {b.kind_per_million(k):.2f}"
                        for k, _ in Counter(b.by_kind).most_common()
                    ),
                    flush=True,
                )
    results_data = [vars(b) for b in results]
    rec.finish({"rate": rate, "seconds": seconds, "settle": args.settle, "results": results_data})
    return 0 if all(b.error is None for b in results) else 1


if __name__ == "__main__":
    sys.exit(main())
