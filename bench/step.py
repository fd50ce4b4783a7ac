"""The parent half of a benchmark session: load generator here, Spark in a fresh subprocess.

:func:`run_child_session` is every system's runner, bound to the system's child::

    run_dstream: Runner = partial(run_child_session, "dstream", "bench.peers")

The child is ``python -m <child_module> <system> --port P --seconds S ... --json``; see
``bench/child.py`` for its side of the protocol. A session is one child, one JVM: the load
generator offers the rates one after the other, ``step_s`` each, on the same connection, and
the parent judges each step from the batches the child reports as they complete, a few batch
intervals after the step ended (while the next step runs). The session ends after the first
unsustained step, so no step starts with a backlog an earlier one left beyond its verdict.
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from bench.child import BATCH_PREFIX, RESULT_PREFIX
from bench.harness import (
    BatchSample,
    CpuSampler,
    SessionResult,
    StepResult,
    summarize_step,
)
from bench.record import REPO_ROOT, SCRATCH_DIR
from spark_receivers.receivers.line_source import LineSource

__all__ = ["LOG_DIR", "REPO_ROOT", "run_child_session"]

LOG_DIR = SCRATCH_DIR / "logs"
"""Each session's log and its child's whole report (every batch): scratch, not committed."""


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


class _ChildOutput:
    """The child's stdout, read on a thread: live batches (latest per id) and the result."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._lock = threading.Lock()
        self._batches: dict[int, dict[str, Any]] = {}
        self.result: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        for line in proc.stdout or []:
            if line.startswith(BATCH_PREFIX):
                entry = json.loads(line[len(BATCH_PREFIX) :])
                with self._lock:
                    self._batches[entry["batch_id"]] = entry
            elif line.startswith(RESULT_PREFIX):
                self.result = json.loads(line[len(RESULT_PREFIX) :])

    def batches(self) -> list[BatchSample]:
        with self._lock:
            return [BatchSample.from_dict(e) for e in self._batches.values()]

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def run_child_session(
    system: str,
    child_module: str,
    rates: Sequence[int],
    step_s: float,
    batch_interval_s: float = 1.0,
    master: str = "local[4]",
    *,
    pipeline: str = "wordcount",
    budget_s: float | None = None,
    on_step: Callable[[StepResult], None] | None = None,
    startup_timeout_s: float = 180.0,
    drain_batches: int = 4,
    stop_timeout_s: float = 60.0,
    extra_args: tuple[str, ...] = (),
    warm_up_steps: int = 0,
) -> SessionResult:
    """Run one session of ``system`` over ``rates`` and judge every step; blocks, bounded.

    Step ``k`` is judged ``2 * batch_interval_s + 1`` seconds after it ended, from the batches
    reported by then. Bounds: the child has ``startup_timeout_s`` to connect; the session
    ends after the first unsustained step, or before a step that would be judged later than
    ``budget_s`` after the call; then the child has ``drain_batches * batch_interval_s`` to
    drain plus ``stop_timeout_s`` to stop and report, past which its process group is killed.
    The session's own figures (lines sent and processed in all, the child's ``extra``, the
    log) go in the ``extra`` of its last step. The first ``warm_up_steps`` steps are the
    warm-up (:class:`bench.harness.Runner`): marked, and their failure does not end the
    session (the child's does).
    """
    if not rates:
        raise ValueError("a session needs at least one rate")
    log_name = f"{system}-{pipeline}-{rates[0]}-{time.strftime('%Y%m%dT%H%M%S')}"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{log_name}.log"
    raw_path = log_path.with_suffix(".json")
    drain_s = drain_batches * batch_interval_s
    grace_s = 2 * batch_interval_s + 1.0
    t_call = time.monotonic()
    session_end = None if budget_s is None else t_call + budget_s
    result = SessionResult()
    error: str | None = None
    server = LineSource.stepped([(r, step_s) for r in rates], accept_timeout_s=startup_timeout_s)
    with server, CpuSampler() as cpu:
        cmd = [
            sys.executable, "-m", child_module, system,
            "--port", str(server.port),
            "--seconds", str(server.seconds),
            "--batch-interval", str(batch_interval_s),
            "--master", master,
            "--drain", str(drain_s),
            "--json",
            "--pipeline", pipeline,
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
            output = _ChildOutput(proc)
            exited = threading.Event()
            either = threading.Event()  # the receiver connected (or gave up), or the child died

            def watch_child() -> None:
                proc.wait()
                exited.set()
                either.set()

            def watch_connection() -> None:
                server.wait_connected()  # bounded by the server's accept timeout
                either.set()

            threading.Thread(target=watch_child, daemon=True).start()
            threading.Thread(target=watch_connection, daemon=True).start()
            either.wait(startup_timeout_s + 30)
            t0 = server.info().started_at_s
            if t0 is None:
                error = server.info().error or f"child exited with {proc.returncode}"
                error = f"never connected: {error}; see {log_path}"
            for k, rate in enumerate(rates if t0 is not None else ()):
                start, end = server.step_window(k)
                exited.wait(max(0.0, t0 + end + grace_s - time.monotonic()))
                if exited.is_set():
                    error = f"child exited ({proc.returncode}) during the session; see {log_path}"
                lines_before = server.lines_sent_by(t0 + start)
                step = summarize_step(
                    system=system,
                    pipeline=pipeline,
                    offered_rate=rate,
                    seconds=step_s,
                    batch_interval_s=batch_interval_s,
                    lines_sent=server.lines_sent_by(t0 + end) - lines_before,
                    lines_before=lines_before,
                    started_at_s=t0 + start,
                    send_time_of=server.send_time_of,
                    batches=output.batches(),
                    error=error or server.info().error,
                    wall_s=step_s,
                    extra={
                        "load_1m": round(os.getloadavg()[0], 2),
                        "busy_cores": cpu.busy_cores(t0 + start, t0 + end),
                        **({"warm_up": True} if k < warm_up_steps else {}),
                    },
                )
                result.steps.append(step)
                if on_step is not None:
                    on_step(step)
                if not step.sustained and (k >= warm_up_steps or exited.is_set()):
                    break
                if k + 1 < len(rates) and session_end is not None:
                    _, next_end = server.step_window(k + 1)
                    if t0 + next_end + grace_s + drain_s > session_end:
                        result.cut_rates = list(rates[k + 1 :])
                        break
            server.stop()  # the receiver reads EOF
            info = server.info()
            try:
                if proc.poll() is None and proc.stdin is not None:
                    proc.stdin.write(json.dumps({"lines_sent": info.lines_sent}) + "\n")
                    proc.stdin.close()
                proc.wait(drain_s + stop_timeout_s)
            except subprocess.TimeoutExpired:
                error = error or f"child overran drain + stop ({drain_s + stop_timeout_s} s)"
                _kill_group(proc)
            except BrokenPipeError:
                proc.wait(stop_timeout_s)
            output.join(10)
    payload = output.result
    raw_path.write_text(
        json.dumps(
            {"server": asdict(info), "rates": list(rates), "step_s": step_s, **payload}, indent=1
        )
    )
    if not payload and error is None:
        error = f"child printed no result (exit {proc.returncode}); see {log_path}"
    error = error or payload.get("error")
    processed = sum(int(b.get("lines", 0)) for b in payload.get("batches", []))
    processed += int(payload.get("extra", {}).get("lines_in_incomplete_batches", 0))
    session = {
        **payload.get("extra", {}),
        "session_lines_sent": info.lines_sent,
        "session_lines_processed": processed,
        "session_wall_s": round(time.monotonic() - t_call, 1),
        "log": str(log_path.relative_to(REPO_ROOT)),
        "raw": str(raw_path.relative_to(REPO_ROOT)),
    }
    if not result.steps:  # it never got to a step: report the failure as its first one
        result.steps.append(
            StepResult(system, pipeline, rates[0], step_s, 0, 0, reason=error or "", error=error)
        )
    last = result.steps[-1]
    last.extra.update(session)
    if error and last.sustained:  # the session failed after its last verdict: say so there
        reason = f"error: {error[:160]}"
        result.steps[-1] = replace(last, sustained=False, reason=reason, error=error)
    return result
