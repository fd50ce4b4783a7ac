"""The package as a user gets it: ``python -m build`` makes an sdist and a wheel, the wheel
installs into a fresh venv and imports, and its metadata is what pyproject.toml promises.

Bounded and offline: ``--no-isolation`` builds with the setuptools of the dev set (no
download of a build environment), and the wheel goes into a fresh venv with
``--no-deps --no-index``. That venv sees the project's site-packages through a ``.pth``
path line, so pyspark, pyarrow and pandas are not downloaded again; a path line does not
process the ``.pth`` files of that directory, so the project's editable install is not
seen, and the test checks that ``spark_receivers`` is imported from the fresh venv.
"""

from __future__ import annotations

import email
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300


def run(*cmd: str | Path, cwd: Path) -> str:
    result = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{cmd} failed:\n{output[-4000:]}"
    return output


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    log = run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=out)
    # setuptools warns about a deprecated license table or classifier: none of those
    # (distutils' "byte-compiling is disabled" under PYTHONDONTWRITEBYTECODE is no such warning).
    flagged = [
        line
        for line in log.splitlines()
        if "deprecat" in line.lower()
        or ("warning" in line.lower() and "setuptools" in line.lower())
    ]
    assert flagged == [], log[-4000:]
    return out


def test_build_makes_an_sdist_and_a_wheel_with_license_and_typing(dist):
    (sdist,) = dist.glob("spark_receivers-*.tar.gz")
    (wheel,) = dist.glob("spark_receivers-*-py3-none-any.whl")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "pyproject.toml", "spark_receivers/py.typed"} <= names
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(zf.read(meta_name))
    assert "spark_receivers/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert "License" not in meta  # the deprecated free-text field
    requires = meta.get_all("Requires-Dist")
    assert "pyspark<5,>=4.2" in requires
    for dist_name, extra in (
        ("redis", "redis"),
        ("paho-mqtt", "mqtt"),
        ("pika", "amqp"),
        ("nats-py", "nats"),
        ("websockets", "websocket"),
    ):
        (line,) = [r for r in requires if r.startswith(dist_name)]
        assert f'extra == "{extra}"' in line  # optional: only with its extra
    for dist_name in ("aiohttp", "prometheus-client", "rich"):  # the status page, the live view
        (line,) = [r for r in requires if r.startswith(dist_name)]
        assert "extra ==" not in line
    assert "spark_receivers/driver/observe/ui/status.html" in names  # the page ships in the wheel
    assert "spark_receivers/driver/observe/ui/status.js" in names
    extras = {"http", "redis", "mqtt", "amqp", "nats", "websocket", "all", "dev"}
    assert extras <= set(meta.get_all("Provides-Extra"))


def test_the_wheel_installs_into_a_fresh_venv_and_imports(dist, tmp_path):
    (wheel,) = dist.glob("spark_receivers-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
        "--quiet", wheel, cwd=tmp_path)  # fmt: skip
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                    cwd=tmp_path).strip())  # fmt: skip
    (site / "_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = (
        "import spark_receivers, spark_receivers.testing, spark_receivers.cli\n"
        "from spark_receivers import *\n"
        "from spark_receivers import __all__, __version__\n"
        "assert StreamingContext and Receiver and UnionStream and MissingDependencyError\n"
        "print(spark_receivers.__file__, __version__, len(__all__))\n"
    )
    out = run(python, "-c", check, cwd=tmp_path).split()
    assert Path(out[0]).is_relative_to(venv), f"imported from {out[0]}, not the fresh venv"
    assert out[1] == "0.1.0.dev0"
    assert (venv / "bin" / "spark-receivers").exists()  # the console script
