"""Python environments for executors that do NOT have spark_receivers, built once and kept.

* :func:`bare_env`: a venv with only what PySpark's workers need (pyarrow, pandas
  and their dependencies, at the versions of the project's venv) — no
  spark_receivers, no pyspark (executors put the pyspark package's
  ``python/lib/pyspark.zip`` on their path themselves). Executors that run it
  must be given our package: ``--py-files``, or the shipping done at ``start()``.
* :func:`packed_env`: the same plus spark-receivers installed from a wheel of
  this checkout, packed with venv-pack into ``env.tar.gz`` for
  ``--archives env.tar.gz#env`` and ``spark.pyspark.python=./env/bin/python``.

Both hold the files of this venv's own pyarrow, pandas, numpy and what they need,
hard-linked (copied across file systems): the wheels pip installed here, at the same
versions, so no test waits for pip to unpack them again; only the packed env's
spark-receivers wheel is installed by pip. Kept under ``$SPARK_RECEIVERS_TEST_ENVS`` (default
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


def _make_venv(path: Path) -> None:
    """A venv at ``path`` with :data:`REQUIREMENTS` (and what they need) linked in.

    Made without pip: ensurepip's own install of pip was a fifth of the time of building
    one, and this venv's pip installs what else goes in (:func:`_pip_install`).
    """
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", "--without-pip", str(path)], f"python -m venv {path}")
    _link_distributions(_site_packages(path), _closure(REQUIREMENTS))


def _pip_install(venv: Path, args: list[str]) -> None:
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    _run([*pip, "--quiet", "--disable-pip-version-check", *args], f"pip install {' '.join(args)}")


def _closure(names: tuple[str, ...]) -> list[str]:
    """``names`` and what they require (for this Python, no extras), as installed here."""
    from packaging.requirements import Requirement

    seen: list[str] = []
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        for line in importlib.metadata.requires(name) or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _link_distributions(site: Path, names: list[str]) -> None:
    """Install ``names`` into ``site`` as the files pip installed here: hard links (copies
    across file systems). The same wheels at the same versions as ``pip install`` of the
    pins would unpack, without a minute of unpacking and byte-compiling pyarrow, pandas and
    numpy again; the console scripts (``bin/``), which no test runs, are left out."""
    here = Path(importlib.metadata.distribution("pyarrow").locate_file("")).resolve()
    for name in names:
        for file in importlib.metadata.distribution(name).files or ():
            src = Path(file.locate()).resolve()
            if not src.is_relative_to(here) or not src.is_file():
                continue  # bin/ scripts, or a RECORD line for a file that is not there
            dst = site / src.relative_to(here)
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)


def _no_build_isolation() -> list[str]:
    """``--no-build-isolation`` when this venv has the build backend pyproject.toml asks
    for (setuptools>=77): half the time of a wheel built in a fresh isolated env."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return []
    return ["--no-build-isolation"] if major >= 77 else []


def _site_packages(venv: Path) -> Path:
    v = sys.version_info
    return venv / "lib" / f"python{v.major}.{v.minor}" / "site-packages"


def bare_env() -> Path:
    """A venv with pyarrow and pandas but no spark_receivers; return its python."""
    pins = _pins()
    key = hashlib.sha256(" ".join([sys.version, *pins]).encode()).hexdigest()[:10]
    path = envs_root() / f"bare-{key}"
    python = path / "bin" / "python"
    if not (path / ".ready").exists():
        shutil.rmtree(path, ignore_errors=True)
        _make_venv(path)
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
            *_no_build_isolation(),
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
    # The pinned packages linked as in the bare env (pip's unpacking and byte-compiling of
    # them again was ~50 s of the ~110 s this took).
    _make_venv(venv)
    _pip_install(venv, ["--no-deps", str(wheel)])
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
