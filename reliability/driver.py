"""The driver of a chaos or soak run: ``spark-receivers ingest`` on the standalone cluster.

A process of its own (its own session, so that kill -9 takes its JVM with it), started
again after each kill with the same arguments: ``--checkpoint --wal`` make the new
one recover through ``StreamingContext.get_or_create``. Its output goes to a log per
incarnation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from reliability import procs

CLUSTER_CONF = {
    "spark.executor.cores": "2",
    "spark.cores.max": "4",
    "spark.executor.memory": "768m",
    "spark.driver.memory": "768m",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.showConsoleProgress": "false",
}


def spark_env(spark_home: Path, conf_dir: Path) -> dict[str, str]:
    """The environment of a driver submitted to the cluster (none of the caller's SPARK_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(
        SPARK_HOME=str(spark_home),
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYSPARK_PYTHON=sys.executable,
    )
    return env


class IngestDriver:
    """``ingest ... --checkpoint ... --wal`` against ``master``; see the module doc."""

    def __init__(
        self,
        root: Path,
        master: str,
        args: list[str],
        conf: dict[str, str],
        env: dict[str, str],
        app: str | None = None,
    ) -> None:
        """``app``: a driver script of ours (``--master``, ``--conf``) to run instead of ingest."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        merged = {**CLUSTER_CONF, **conf}
        if app is None:
            self.cmd = [sys.executable, "-m", "spark_receivers.cli", "ingest", "--master", master]
            self.cmd += ["--no-ui", *args]
        else:
            self.cmd = [sys.executable, app, "--master", master, *args]
        self.cmd += [x for k, v in merged.items() for x in ("--conf", f"{k}={v}")]
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.logs: list[Path] = []

    def start(self) -> None:
        self.starts += 1
        log = self.root / f"driver-{self.starts}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.root,
                start_new_session=True,
            )

    def pids(self) -> list[int]:
        """Every process of the driver now: its Python and its JVM."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return procs.session_pids(self.proc.pid)

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill9(self) -> list[int]:
        """kill -9 the driver's Python, its JVM and anything else of its session."""
        assert self.proc is not None
        killed = procs.kill9(procs.session_pids(self.proc.pid))
        self.proc.wait(60)
        return killed

    def stop_gracefully(self, timeout_s: float) -> int:
        """Ctrl-C (a graceful stop: every received record processed); the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()
            return -9

    def log_text(self, incarnation: int | None = None) -> str:
        paths = self.logs if incarnation is None else [self.logs[incarnation - 1]]
        return "\n".join(p.read_text(errors="replace") for p in paths if p.exists())

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text(self.starts).splitlines()[-lines:])
