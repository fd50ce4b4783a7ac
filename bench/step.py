"""The parent half of a benchmark step: load generator here, Spark in a fresh subprocess.

:func:`run_child_step` is what every system's runner calls::

    def run_dstream(offered_rate, seconds, batch_interval_s=1.0, master="local[4]", *,
                    ingest_only=False):
        return run_child_step("dstream", "bench.peers", offered_rate, seconds,
                              batch_interval_s, master, ingest_only=ingest_only)

The child is ``python -m <child_module> <system> --port P --seconds S ... --json``; see
``bench/child.py`` for its side of the protocol. Every step gets its own JVM, so nothing
(caches, JIT, leaked threads, a backlog) carries from one step or system to the next.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.child import RESULT_PREFIX
from bench.harness import BatchSample, StepResult, summarize_step
from bench.loadgen import LineServer

__all__ = ["LOG_DIR", "REPO_ROOT", "run_child_step"]

REPO_ROOT = Path(__file__).resolve().parents[1]
LOG_DIR = REPO_ROOT / "bench" / "out" / "logs"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers import bench.* and spark_receivers.* from the checkout.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO_ROOT), env.get("PYTHONPATH", "")] if p)
    return env


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the child and its JVM: the child leads its own process group."""
    with contextlib.suppress(ProcessLookupError):  # it exited between timeout and kill
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def run_child_step(
    system: str,
    child_module: str,
    offered_rate: int | None,
    seconds: float,
    batch_interval_s: float = 1.0,
    master: str = "local[4]",
    *,
    ingest_only: bool = False,
    startup_timeout_s: float = 180.0,
    drain_batches: int = 4,
    stop_timeout_s: float = 60.0,
    extra_args: tuple[str, ...] = (),
) -> StepResult:
    """Run one step of ``system`` and summarize it; blocks, bounded by the timeouts.

    Bounds: the child has ``startup_timeout_s`` to connect, then the send window runs
    ``seconds``, then the child has ``drain_batches * batch_interval_s`` to drain plus
    ``stop_timeout_s`` to stop and report; past that its process group is killed.
    """
    pipeline = "ingest" if ingest_only else "wordcount"
    rate_label = "max" if offered_rate is None else str(offered_rate)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{system}-{pipeline}-{rate_label}.log"
    drain_s = drain_batches * batch_interval_s
    error: str | None = None
    payload: dict[str, Any] = {}
    t_wall = time.monotonic()
    load_at_start = os.getloadavg()[0]  # the machine is shared: say how busy it was
    with LineServer(offered_rate, seconds, accept_timeout_s=startup_timeout_s) as server:
        cmd = [
            sys.executable, "-m", child_module, system,
            "--port", str(server.port),
            "--seconds", str(seconds),
            "--batch-interval", str(batch_interval_s),
            "--master", master,
            "--drain", str(drain_s),
            "--json",
            *(["--ingest-only"] if ingest_only else []),
            *extra_args,
        ]  # fmt: skip
        with log_path.open("w") as log_file:
            proc = subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                env=_child_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                start_new_session=True,
            )
            stdout_lines: list[str] = []
            reader = threading.Thread(
                target=lambda: stdout_lines.extend(proc.stdout or []), daemon=True
            )
            reader.start()
            # Wake on whichever comes first: the window closing or the child dying.
            either = threading.Event()

            def on_window_end() -> None:
                server.wait_finished()  # bounded: accept timeout + seconds
                either.set()

            def on_child_exit() -> None:
                proc.wait()
                either.set()

            threading.Thread(target=on_window_end, daemon=True).start()
            threading.Thread(target=on_child_exit, daemon=True).start()
            either.wait(startup_timeout_s + seconds + 30)
            info = server.info()
            try:
                if proc.poll() is not None:
                    error = f"child exited with {proc.returncode} during the window; see {log_path}"
                elif not server.wait_finished(0):
                    error = f"load generator did not finish in time; see {log_path}"
                elif info.error:
                    error = f"load generator: {info.error}; see {log_path}"
                if proc.poll() is None and proc.stdin is not None:
                    proc.stdin.write(json.dumps({"lines_sent": info.lines_sent}) + "\n")
                    proc.stdin.close()
                proc.wait(drain_s + stop_timeout_s)
            except subprocess.TimeoutExpired:
                error = (
                    error or f"child overran drain + stop ({drain_s + stop_timeout_s} s); killed"
                )
                _kill_group(proc)
            except BrokenPipeError:
                proc.wait(stop_timeout_s)
            finally:
                server.stop()
            reader.join(10)
    info = server.info()
    for line in stdout_lines:
        if line.startswith(RESULT_PREFIX):
            payload = json.loads(line[len(RESULT_PREFIX) :])
    raw_path = log_path.with_suffix(".json")
    raw_path.write_text(
        json.dumps(
            {"server": asdict(info), "chunks": len(server.chunk_times()), **payload}, indent=1
        )
    )
    if not payload and error is None:
        error = f"child printed no result (exit {proc.returncode}); see {log_path}"
    error = error or payload.get("error")
    batches = [BatchSample.from_dict(b) for b in payload.get("batches", [])]
    extra = dict(payload.get("extra", {}))
    extra["load_1m"] = round(max(load_at_start, os.getloadavg()[0]), 2)
    extra["log"] = str(log_path.relative_to(REPO_ROOT))
    extra["raw"] = str(raw_path.relative_to(REPO_ROOT))
    return summarize_step(
        system=system,
        pipeline=pipeline,
        offered_rate=offered_rate,
        seconds=seconds,
        batch_interval_s=batch_interval_s,
        lines_sent=info.lines_sent,
        started_at_s=info.started_at_s,
        send_time_of=server.send_time_of,
        batches=batches,
        error=error,
        wall_s=time.monotonic() - t_wall,
        extra=extra,
    )
