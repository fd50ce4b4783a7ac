"""A class-data-sharing archive of the Spark JVM's classes, for the JVMs the tests start.

A test's JVM (a CLI run, a scenario's driver, an example) loads and verifies ~10,000
classes from pyspark's jars at every start. JDK 17 maps its own classes from the JDK's
default archive (``lib/server/classes.jsa``) already; a *dynamic* archive adds Spark's,
Scala's and Hadoop's: dumped once by a JVM that ran a small Spark workload
(``-XX:ArchiveClassesAtExit``), then mapped by every later JVM (``-XX:SharedArchiveFile``)
instead of parsing and verifying the classes again.

Built from the venv's own jars, never downloaded: :func:`ensure` writes it under the venv
(``<sys.prefix>/spark-cds/``), named by a key of the JDK, the jars and the flags, so an
upgrade of either builds a new one. A JVM maps the archive's classes only when the
existing entries of its class path are the jars it was dumped with: Spark puts its conf
dir first, which is why the standalone cluster's conf dir (tests/integration/standalone.py)
is left absent rather than empty. A JVM of another class path runs as without the archive
(only its JDK classes shared) and says so only in its ``cds`` log, which :data:`QUIET`
turns off: that log goes to stdout, where ``spark-class`` and ``ingest --progress json``
print what tests read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
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


def ensure(flags: str, say=print) -> Path | None:
    """The archive for ``flags`` (the JVM options the tests' JVMs get), built if missing.

    Returns None when it cannot be built (said through ``say``): the tests then run
    without it, only slower. Blocks for the build (~20 s of CPU, once per venv).
    """
    try:
        path = archive_path(flags)
    except (OSError, ImportError) as e:
        say(f"no JVM class archive: {e}")
        return None
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("*.jsa"):  # another JDK's or jars', of no use now
        old.unlink(missing_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        dumped = Path(tmp) / "dump.jsa"
        env = {**os.environ, "JAVA_TOOL_OPTIONS": flags, "SPARK_LOCAL_IP": "127.0.0.1"}
        env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        done = subprocess.run(
            [sys.executable, __file__, f"-XX:ArchiveClassesAtExit={dumped}"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp,
            check=False,
        )
        if done.returncode != 0 or not dumped.is_file():
            tail = (done.stdout + done.stderr)[-2000:]
            say(f"no JVM class archive: the dump run exited {done.returncode}:\n{tail}")
            return None
        os.replace(dumped, path)  # whole or not at all: a concurrent run sees one or none
    say(f"built the JVM class archive {path} in {time.monotonic() - started:.0f} s")
    return path


def options(path: Path) -> str:
    """The JVM options that map ``path`` (to add to the tests' ``JAVA_TOOL_OPTIONS``)."""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def _dump(java_option: str) -> int:
    """The dumping JVM's workload, run with ``java_option`` on the driver; its exit status.

    A session, SQL with a shuffle, a Python UDF, parquet written and read, a Python RDD
    and a streaming query: the kinds of job the receivers' tests run. Classes it does not
    load are loaded as usual by the JVMs that need them.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", java_option)  # that JVM only
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
    return jvm.wait(300)


if __name__ == "__main__":
    sys.exit(_dump(sys.argv[1]))
