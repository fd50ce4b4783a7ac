"""Every section of ``make bench``, and the soak, in its smoke mode: it runs, it records.

Each runs in a process of its own (as ``make bench`` runs it), writes its section into a
file of the test's own and its raw file into a directory of the test's own, and the section
says where its figures come from (smoke run, commit, machine, raw file). Then ``python -m
bench.run --from-raw`` renders the same section again from the raw file alone, byte for
byte. Nothing here judges a figure: on a loaded machine the figures mean nothing; that the
bench runs end to end and records what it did is what is tested.

The sections without Spark run in every ``make test`` (about 1.5 min in all on a loaded
2-core machine). Those that start JVMs, and the soak (a standalone cluster), take 2-5 min
each there (22 min for the seven on 2026-11-25 at a load average of ~20), more than the
suite can afford: they carry the marker ``bench_smoke``, which ``make test`` leaves out
(``-m 'not bench_smoke'`` in pyproject.toml), and ``make bench-smoke`` runs them, as
before a ``make bench``. The chaos's short run is
``tests/integration/test_chaos.py``, in every ``make test``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RAW_LIMIT = 64 * 1024  # summaries and per-step figures, never per-record data
LONG = pytest.mark.bench_smoke  # minutes of JVMs each: make bench-smoke, not make test

WITHOUT_SPARK = [
    ("tracker", ["--supervisors", "20", "--seconds", "2", "--repeats", "2", "--clients", "1"]),
    ("store", ["--pipeline-seconds", "0", "--forms", "one"]),
    ("wal", ["--pipeline-seconds", "0"]),
    ("replication", ["--skip-word-count", "--store-seconds", "1"]),
]
WITH_SPARK = [
    ("latency", ["--seconds", "4"]),
    ("backpressure", ["--seconds", "6"]),
    ("cold_start", ["--systems", "spark_receivers", "--rate", "5000", "--seconds", "5"]),
    ("repeated_actions", ["--seconds", "4"]),
    ("query_floor", ["--rungs", "346000", "--runs", "1", "--warm-up", "0"]),
    ("observability", ["--rates", "5000", "--seconds", "5"]),
    ("cpu_breakdown", ["--systems", "spark_receivers", "--pipelines", "ingest", "--no-profile"]),
    ("throughput", ["--systems", "spark_receivers", "--pipelines", "ingest", "--ingest-systems",
                    "spark_receivers", "--lowest", "5000", "--highest", "5000", "--seconds", "5"]),
]  # fmt: skip


def _env() -> dict[str, str]:
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)


def _run(
    cmd: list[str], timeout_s: float, codes: tuple[int, ...] = (0,)
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert proc.returncode in codes, (
        f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" + (proc.stderr[-3000:])
    )
    return proc


def _check_record(name: str, out: Path, results: Path) -> None:
    text = out.read_text()
    assert text.count(f"<!-- generated: {name} ") == 1 and f"<!-- end: {name} -->" in text
    assert "- **Smoke run** (`--quick`)" in text and "at commit `" in text
    (raw,) = results.glob(f"{name}-*.json.gz")
    assert raw.stat().st_size < RAW_LIMIT, f"{raw} is {raw.stat().st_size:,} bytes"
    assert f"- **Raw results** [`{raw}`]" in text
    out.write_text(text.replace("- **Smoke run**", "- edited by hand"))
    _run([sys.executable, "-m", "bench.run", "--from-raw", str(raw), "--output", str(out)], 120)
    assert out.read_text() == text  # the same section again, from the raw file alone


def _smoke(module: str, name: str, args: list[str], tmp_path: Path, timeout_s: float) -> None:
    out, results = tmp_path / "BENCHMARKS.md", tmp_path / "results"
    cmd = [sys.executable, *module.split(), "--quick", *args]
    _run([*cmd, "--output", str(out), "--results-dir", str(results)], timeout_s)
    _check_record(name, out, results)


@pytest.mark.parametrize(("name", "args"), WITHOUT_SPARK, ids=[n for n, _ in WITHOUT_SPARK])
@pytest.mark.timeout(300)
def test_a_section_without_spark_runs_and_records_in_its_smoke_mode(name, args, tmp_path):
    from bench.run import SECTIONS

    _smoke(f"-m {SECTIONS[name]}", name, args, tmp_path, 240)


@LONG
@pytest.mark.spark
@pytest.mark.parametrize(("name", "args"), WITH_SPARK, ids=[n for n, _ in WITH_SPARK])
@pytest.mark.timeout(420)
def test_a_section_with_spark_runs_and_records_in_its_smoke_mode(name, args, tmp_path):
    from bench.run import SECTIONS

    _smoke(f"-m {SECTIONS[name]}", name, args, tmp_path, 400)


def test_every_section_of_make_bench_has_a_smoke_case_here():
    from bench.run import SECTIONS

    assert sorted(n for n, _ in [*WITHOUT_SPARK, *WITH_SPARK]) == sorted(SECTIONS)


@LONG
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_the_soak_runs_and_records_in_its_smoke_mode(tmp_path):
    """A standalone cluster and a redis-server of its own, a minute and a half of soak.

    Its verdict may go either way (a 45 s second half says nothing about a leak): exit 0 or
    1, with the section written; a run that broke writes none.
    """
    out, results = tmp_path / "RELIABILITY.md", tmp_path / "results"
    cmd = [sys.executable, "scripts/soak.py", "--quick", "--minutes", "1.5", "--sample-s", "5"]
    cmd += ["--probe-records", "5000", "--record", "--output", str(out)]
    _run([*cmd, "--results-dir", str(results)], 850, codes=(0, 1))
    _check_record("soak", out, results)
    assert "| driver RSS | " in out.read_text()
