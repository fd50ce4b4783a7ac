"""Python environments for executors that do NOT have spark_receivers, built once and kept.

* :func:`bare_env`: a venv with only what PySpark's workers need (pyarrow, pandas
  and their dependencies, at the versions of the project's venv) — no
  spark_receivers, no pyspark (executors put the pyspark package's
  ``python/lib/pyspark.zip`` on their path themselves). Executors that run it
  must be given our package: ``--py-files``, or the shipping done at ``start()``.
* :func:`packed_env`: the same plus spark-receivers installed from a wheel of
  this checkout, packed with venv-pack into ``env.tar.gz`` for
  ``--archives env.tar.gz#env`` and ``spark.pyspark.python=./env/bin/python``.

pip installs from its cache and configured indexes (no new downloads once
cached). Kept under ``$SPARK_RECEIVERS_TEST_ENVS`` (default
``/tmp/spark-receivers-test-envs-$UID``), keyed by the versions (and, for the
packed one, by a hash of the package), so a second run reuses them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ("pyarrow", "pandas", "numpy")


def envs_root() -> Path:
    default = f"/tmp/spark-receivers-test-envs-{os.getuid()}"
    root = Path(os.environ.get("SPARK_RECEIVERS_TEST_ENVS", default))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _pins() -> list[str]:
    return [f"{name}=={importlib.metadata.version(name)}" for name in REQUIREMENTS]


def _run(cmd: list[str], what: str, timeout: float = 600) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{what} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )


def _make_venv(path: Path, packages: list[str], no_deps: tuple[str, ...] = ()) -> None:
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", str(path)], f"python -m venv {path}")
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    _run([*pip, *packages], f"pip install {' '.join(packages)}")
    if no_deps:
        _run([*pip, "--no-deps", *no_deps], f"pip install --no-deps {' '.join(no_deps)}")


def bare_env() -> Path:
    """A venv with pyarrow and pandas but no spark_receivers; return its python."""
    pins = _pins()
    key = hashlib.sha256(" ".join([sys.version, *pins]).encode()).hexdigest()[:10]
    path = envs_root() / f"bare-{key}"
    python = path / "bin" / "python"
    if not (path / ".ready").exists():
        shutil.rmtree(path, ignore_errors=True)
        _make_venv(path, pins)
        (path / ".ready").touch()
    # Isolated (-I) and away from the checkout: from the repository's root, ``-c`` finds its
    # ``spark_receivers/`` (whose ``__init__`` imports nothing since it loads names lazily).
    probe = subprocess.run(
        [str(python), "-I", "-c", "import spark_receivers"],
        capture_output=True,
        timeout=60,
        cwd=path,
    )
    assert probe.returncode != 0, "the bare env must not have spark_receivers"
    return python


def package_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted((ROOT / "spark_receivers").rglob("*.py")):
        digest.update(path.read_bytes())
    digest.update((ROOT / "pyproject.toml").read_bytes())
    return digest.hexdigest()[:10]


def packed_env() -> Path:
    """``env.tar.gz``: the bare env plus spark-receivers, packed by venv-pack; its path."""
    pins = _pins()
    key = hashlib.sha256(" ".join([sys.version, *pins, package_hash()]).encode()).hexdigest()[:10]
    out = envs_root() / f"env-{key}.tar.gz"
    if out.exists():
        return out
    for old in envs_root().glob("env-*.tar.gz"):
        old.unlink()
    wheels = envs_root() / f"wheel-{key}"
    shutil.rmtree(wheels, ignore_errors=True)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        "building the spark-receivers wheel",
    )
    (wheel,) = wheels.glob("spark_receivers-*.whl")
    venv = envs_root() / f"packed-{key}"
    shutil.rmtree(venv, ignore_errors=True)
    # No pyspark in it: executors run PySpark from their Spark's python/lib/pyspark.zip.
    _make_venv(venv, pins, no_deps=(str(wheel),))
    tmp = out.with_name(out.name + ".tmp.tar.gz")
    _run(
        [
            str(Path(sys.executable).with_name("venv-pack")),
            "-p",
            str(venv),
            "-o",
            str(tmp),
            "--compress-level",
            "1",
            "--force",
        ],
        "venv-pack",
    )
    tmp.rename(out)
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(wheels, ignore_errors=True)
    return out


def package_zip(directory: Path) -> Path:
    """``spark_receivers.zip`` of this checkout, as a user would make it for --py-files."""
    out = directory / "spark_receivers.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted((ROOT / "spark_receivers").rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                z.write(path, str(path.relative_to(ROOT)))
    return out
