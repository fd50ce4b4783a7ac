"""A class-data-sharing archive of the Spark JVM's classes, for the JVMs the tests start.

A test's JVM (a CLI run, a scenario's driver, an example) loads and verifies ~10,000
classes from pyspark's jars at every start. JDK 17 maps its own classes from the JDK's
default archive (``lib/server/classes.jsa``) already; a *dynamic* archive adds Spark's,
Scala's and Hadoop's: dumped once by a JVM that ran a small Spark workload
(``-XX:ArchiveClassesAtExit``), then mapped by every later JVM (``-XX:SharedArchiveFile``)
instead of parsing and verifying the classes again.

Built from the venv's own jars, never downloaded: :func:`begin` has it dumped under the
venv (``<sys.prefix>/spark-cds/``), beside the first tests, named by a key of the JDK, the
jars and the flags, so an upgrade of either builds a new one. A JVM maps the archive's
classes only when the existing entries of its class path are the jars it was dumped
with: Spark puts its conf dir first, which is why the standalone cluster's conf dir
(tests/integration/standalone.py) is left absent rather than empty. A JVM of another
class path (or started before the archive exists) runs as without it and says so only in
its ``cds`` log, which :data:`QUIET` turns off: that log goes to stdout, where
``spark-class`` and ``ingest --progress json`` print what tests read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The tests' JVM options without the archive (why: tests/conftest.py)."""

# Both tags the JDK logs an unusable archive under (a class path mismatch is a warning).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _spark_jars() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(os.environ.get("SPARK_HOME") or _find_spark_home()) / "jars"


def _java() -> Path:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else shutil.which("java")
    if not found:
        raise FileNotFoundError("no java on PATH and no JAVA_HOME")
    return Path(found).resolve()


def archive_path(flags: str) -> Path:
    """Where the archive of these JVM flags, this JDK and these jars is (or will be)."""
    key = hashlib.sha256(flags.encode())
    java = _java()
    for f in sorted(java.parent.parent.glob("lib/server/*")):  # libjvm.so, classes.jsa
        st = f.stat()
        key.update(f"{f}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for jar in sorted(_spark_jars().glob("*.jar")):
        st = jar.stat()
        key.update(f"{jar}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return Path(sys.prefix) / "spark-cds" / f"{key.hexdigest()[:16]}.jsa"


@dataclass
class ArchiveBuild:
    """The archive for a run's JVM options, and the dump that builds it if it is missing."""

    path: Path
    process: subprocess.Popen | None = None  # None: the archive was there already
    workdir: Path | None = None
    started: float = 0.0  # time.time() at the start of the dump

    def finish(self, say=print, timeout_s: float = 600.0) -> None:
        """Wait for the dump (bounded), say how it ended and remove its directory.

        The build is part of the run that started it (once per venv): the run ends when
        it does, so no process outlives the tests. Ctrl-C while waiting stops it.
        """
        if self.process is None:
            return
        if self.process.poll() is None:
            say("waiting for the JVM class archive's build to end (once per venv)")
        code: int | str
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = f"not within {timeout_s:g} s"
        finally:  # also on Ctrl-C: its own group (Python, spark-submit, the JVM) goes with it
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            log = self.workdir / "dump.log" if self.workdir else None
            tail = log.read_text(errors="replace")[-2000:] if log and log.is_file() else ""
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
        if code == 0 and self.path.is_file():
            # When the file appeared, not when the run ended (the run waits for the build).
            took = self.path.stat().st_mtime - self.started
            say(f"built the JVM class archive {self.path} in {took:.0f} s")
        else:
            say(f"no JVM class archive: the dump run ended {code}:\n{tail}")


def begin(flags: str, say=print) -> ArchiveBuild | None:
    """The archive for ``flags`` (the tests' JVM options), its build started if it is missing.

    The dump (~70 s of one core on a slow 2-core host) runs beside the first tests instead
    of before them: a JVM that starts while the file is missing runs as without the
    archive (with :data:`QUIET` it says nothing), one that starts later maps it. The dump
    renames its file into place whole, so a JVM sees all of it or none. Returns None when
    no archive can be had (said through ``say``): the tests then run without it, only slower.
    """
    try:
        path = archive_path(flags)
    except (OSError, ImportError) as e:
        say(f"no JVM class archive: {e}")
        return None
    if path.is_file():
        return ArchiveBuild(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("*.jsa"):  # another JDK's or jars', of no use now
        old.unlink(missing_ok=True)
    workdir = Path(tempfile.mkdtemp(dir=path.parent))
    env = {**os.environ, "JAVA_TOOL_OPTIONS": flags, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    with open(workdir / "dump.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, __file__, str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
    say(f"building the JVM class archive {path} beside the first tests (once per venv)")
    return ArchiveBuild(path, process, workdir, time.time())


def options(path: Path) -> str:
    """The JVM options that map ``path`` (to add to the tests' ``JAVA_TOOL_OPTIONS``)."""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def _dump(target: Path) -> int:
    """Dump the archive to ``target``: a JVM that runs a small workload and archives its
    classes at exit; its exit status. Run in a directory of its own (``begin``).

    A session, SQL with a shuffle, a Python UDF, parquet written and read, a Python RDD
    and a streaming query: the kinds of job the receivers' tests run. Classes it does not
    load are loaded as usual by the JVMs that need them.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    dumped = Path("dump.jsa").resolve()
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", f"-XX:ArchiveClassesAtExit={dumped}")
        .getOrCreate()
    )
    jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
    out = tempfile.mkdtemp(dir=".")
    df = spark.range(2000).withColumn("k", F.col("id") % 7)
    df.groupBy("k").agg(F.count("*"), F.sum("id")).collect()
    df.select(F.udf(lambda x: str(x))("id").alias("value")).write.parquet(f"{out}/p")
    spark.read.parquet(f"{out}/p").filter("value like '1%'").count()
    pairs = spark.sparkContext.parallelize(range(100), 2).map(lambda x: (x % 3, x))
    pairs.reduceByKey(lambda a, b: a + b).collect()
    rate = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    query = rate.writeStream.foreachBatch(lambda batch, _: batch.count())
    running = query.trigger(processingTime="200 milliseconds").start()
    running.processAllAvailable()
    running.stop()
    spark.stop()
    jvm.stdin.close()  # the gateway JVM exits at EOF, writing the archive on its way out
    code = jvm.wait(300)
    if code == 0 and dumped.is_file():
        os.replace(dumped, target)  # whole or not at all: a JVM starting now sees one or none
    return code


if __name__ == "__main__":
    sys.exit(_dump(Path(sys.argv[1])))
