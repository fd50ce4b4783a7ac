"""A Spark standalone cluster from the installed pyspark: one Master, two Workers, by PID.

Started with ``bin/spark-class org.apache.spark.deploy.master.Master`` and
``...worker.Worker`` of the pyspark package, as docs/deploy.md tells users. Every
address is given explicitly (``--host``, ``SPARK_LOCAL_IP``,
``SPARK_LOCAL_HOSTNAME``): the Master on 127.0.0.1, each Worker (and so its
executors) on a loopback address of its own (127.0.0.2, 127.0.0.3), so the
driver, the executors and their block servers are on three different "hosts" as
on a real cluster, and anything that advertised the machine's hostname or
``127.0.1.1`` would fail. Ports are free ones picked here; the web UIs' JSON
tells when the workers registered. :meth:`StandaloneCluster.start` fails loudly
(with the logs' tails) when a daemon does not come up; :meth:`stop` ends every
daemon and executor by PID.

Run by hand: ``python tests/integration/standalone.py`` starts a cluster, prints
its master URL and waits for Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")


def spark_home() -> Path:
    """The pyspark package directory: its ``bin/spark-class`` starts the daemons."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen
    log: Path


@dataclass
class StandaloneCluster:
    """Master + Workers of 2 cores each; see the module doc."""

    root: Path
    worker_hosts: tuple[str, ...] = WORKER_HOSTS
    cores: int = 2
    memory: str = "2g"
    master_url: str = ""
    master_ui: str = ""
    daemons: list[Daemon] = field(default_factory=list)

    def _env(self, host: str) -> dict[str, str]:
        # None of the user's spark-defaults.conf: a conf dir of our own. Left absent, not
        # empty: it is first on every daemon's and executor's class path, and the JVM
        # class archive of the tests (tests/jvm_archive.py) matches a class path only
        # when its existing entries are the jars it was dumped with.
        conf_dir = self.root / "conf"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SPARK_", "PYSPARK_")) and k != "PYTHONPATH"
        }
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOCAL_IP=host,
            SPARK_LOCAL_HOSTNAME=host,
            SPARK_LOG_DIR=str(self.root / "logs"),
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def _spawn(self, name: str, host: str, args: list[str]) -> Daemon:
        log = self.root / f"{name}.log"
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(host),
                cwd=self.root,
                start_new_session=True,
            )
        daemon = Daemon(name, proc, log)
        self.daemons.append(daemon)
        return daemon

    def start(self, timeout_s: float = 120.0) -> StandaloneCluster:
        """Start the Master, then the Workers; return once every Worker is ALIVE."""
        self.root.mkdir(parents=True, exist_ok=True)
        port, ui = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        self.master_ui = f"http://127.0.0.1:{ui}"
        self._spawn(
            "master",
            "127.0.0.1",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
        )
        try:
            self._wait(lambda s: s is not None, timeout_s, "the master's web UI")
            for i, host in enumerate(self.worker_hosts):
                work = self.root / f"work-{i}"
                work.mkdir(exist_ok=True)
                self._spawn(
                    f"worker-{i}",
                    host,
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        host,
                        "--port",
                        str(free_port(host)),
                        "--webui-port",
                        str(free_port(host)),
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--work-dir",
                        str(work),
                        self.master_url,
                    ],
                )
            want = len(self.worker_hosts)
            self._wait(
                lambda s: s is not None and len(self._alive(s)) == want,
                timeout_s,
                f"{want} workers ALIVE",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict | None:
        """The master's ``/json`` state (None while it does not answer)."""
        try:
            with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=2) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(state: dict) -> list[dict]:
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def _wait(self, ok, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for d in self.daemons:
                if d.proc.poll() is not None:
                    raise RuntimeError(
                        f"the standalone {d.name} exited ({d.proc.returncode}) while waiting for "
                        f"{what}:\n{self.tails()}"
                    )
            if ok(self.state()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}:\n{self.tails()}")

    def tails(self, lines: int = 30) -> str:
        out = []
        for d in self.daemons:
            with contextlib.suppress(OSError):
                text = d.log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {d.name} ({d.log}) ---\n" + "\n".join(text))
        return "\n".join(out)

    def executor_pids(self) -> dict[str, int]:
        """Executor JVMs started by our workers: ``{executor id: pid}`` (from /proc)."""
        pids = {}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                continue
            if "--executor-id" in args and any(str(self.root) in a for a in args):
                pids[args[args.index("--executor-id") + 1]] = int(entry)
        return pids

    def logs(self) -> str:
        """Every daemon log and every executor's stdout/stderr, concatenated."""
        texts = [d.log.read_text(errors="replace") for d in self.daemons if d.log.exists()]
        for path in sorted(self.root.glob("work-*/*/*/std*")):
            texts.append(path.read_text(errors="replace"))
        return "\n".join(texts)

    def stop(self) -> None:
        """SIGTERM each daemon by PID (a Worker ends its executors), SIGKILL what is left."""
        for d in reversed(self.daemons):
            if d.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(d.proc.pid, signal.SIGTERM)
        for d in self.daemons:
            try:
                d.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(d.proc.pid, signal.SIGKILL)
                d.proc.wait(10)
        for pid in self.executor_pids().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="spark-standalone-"))
    cluster = StandaloneCluster(root).start()
    print(f"master {cluster.master_url}  ui {cluster.master_ui}  root {root}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
