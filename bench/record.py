"""Where a generated record comes from and where it goes: its header, its raw file, its markers.

Every generated section of BENCHMARKS.md and RELIABILITY.md is written here, the same way:

- :class:`Recording` wraps one run of one section. Entering it notes the commit (and the
  paths that differ from it), the machine (``bench/machine.py``, with the load average before)
  and the busy CPU of the whole machine; :meth:`Recording.finish` notes the end, writes the
  run's raw results (compact JSON, gzip) to ``bench/results/<name>-<UTC start>.json.gz``
  and publishes the section.
- :func:`header` is the one function that says where a section's figures come from:
  commit, tree clean or not, UTC start and end, duration, command (relative to the
  repository), machine, load before and after, busy cores during, raw file.
- :func:`write_section` replaces the text between ``<!-- generated: NAME ... -->`` and
  ``<!-- end: NAME -->`` whole, or appends it; everything outside the markers is kept byte
  for byte. Hand-written text lives outside every pair of markers.
- :func:`rerender` publishes a section again from its raw file alone
  (``python -m bench.run --from-raw FILE``).

Adding a section takes a :class:`Section` (its name, title and a ``render(data) -> str``
that builds the body from the raw data only) and, in its ``main``::

    with Recording(SECTION, "python -m bench.my_bench", argv, args) as rec:
        data = measure(...)          # JSON-serializable: summaries, per-step figures
    rec.finish(data)

with :func:`add_record_arguments` on its parser (``--output``, ``--no-write``,
``--results-dir``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import importlib
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.machine import Machine, busy_cpu_seconds, git_state, load_average

__all__ = [
    "REPO_ROOT",
    "RESULTS_DIR",
    "SCRATCH_DIR",
    "Recording",
    "RunInfo",
    "Section",
    "add_record_arguments",
    "command_line",
    "header",
    "load_raw",
    "rerender",
    "write_section",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
"""Raw results of published runs: committed beside the sections that cite them."""
SCRATCH_DIR = REPO_ROOT / "bench" / "out"
"""Raw results of runs that publish nothing (``--no-write``), logs: not committed."""
RECORD_FORMAT = 1


# -- the command ----------------------------------------------------------------------------


def command_line(prog: str, argv: Sequence[str]) -> str:
    """``prog`` and its arguments as a shell line, any path inside the repository made
    relative to it (``--output /abs/checkout/BENCHMARKS.md`` reads ``--output BENCHMARKS.md``).
    """
    root = str(REPO_ROOT) + os.sep

    def rel(arg: str) -> str:
        key, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if value.startswith(root):
            value = value[len(root) :]
        return f"{key}{eq}{value}"

    return shlex.join([*prog.split(), *(rel(a) for a in argv)])


def repo_path(path: str | Path) -> Path:
    """``path`` as given, relative paths taken from the repository's root."""
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def shown(path: Path) -> str:
    """``path`` relative to the repository when inside it, else as it is."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


# -- one run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    """Where one run's figures come from; every generated section starts with it."""

    name: str
    command: str
    commit: str
    changed: list[str]
    """Paths that differed from ``commit`` when the run started (none: a clean tree)."""
    started: str
    """UTC, ISO 8601."""
    ended: str
    machine: Machine
    load_after: tuple[float, float, float]
    busy_cores: float | None
    """Mean cores busy over the run, every process of the machine (``/proc/stat``)."""
    raw: str
    """The raw file, relative to the repository."""
    smoke: bool = False

    @property
    def duration_s(self) -> float:
        return (_utc(self.ended) - _utc(self.started)).total_seconds()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunInfo:
        return cls(
            **{
                **d,
                "machine": Machine.from_dict(d["machine"]),
                "load_after": tuple(d["load_after"]),
            }
        )


def _utc(iso: str) -> dt.datetime:
    return dt.datetime.fromisoformat(iso)


def _stamp(when: dt.datetime) -> str:
    return f"{when:%Y%m%dT%H%M%SZ}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _loads(loads: Sequence[float]) -> str:
    return " / ".join(f"{x:.2f}" for x in loads)


def header(info: RunInfo) -> str:
    """The lines that start every generated section: when, what, where and how loaded.

    The one place that says it, for BENCHMARKS.md and RELIABILITY.md alike.
    """
    started, ended = _utc(info.started), _utc(info.ended)
    end = f"{ended:%H:%M:%S}" if ended.date() == started.date() else f"{ended:%Y-%m-%d %H:%M:%S}"
    if info.changed:
        listed = ", ".join(f"`{p}`" for p in info.changed[:5])
        more = f" and {len(info.changed) - 5} more" if len(info.changed) > 5 else ""
        tree = f"**dirty tree**: uncommitted changes to {listed}{more}"
    else:
        tree = "clean tree"
    m = info.machine
    busy = "-" if info.busy_cores is None else f"{info.busy_cores:.2f} of {m.cores}"
    speed = (
        ""
        if m.core_speed is None
        else f"; one core runs {m.core_speed:.1f} M steps/s of `bench.machine.core_speed`"
    )
    lines = [
        f"- **Ran** {started:%Y-%m-%d %H:%M:%S} to {end} UTC ({_duration(info.duration_s)}) "
        f"at commit `{info.commit}` ({tree})",
        f"- **Command** `{info.command}` (from the repository's root)",
        f"- **Machine** {m.cores} cores ({m.cpu_model}{speed}), {m.memory_gb:.1f} GB; {m.os}; "
        f"Python {m.python_version}, PySpark {m.pyspark_version}, Java: {m.java_version}",
        f"- **Load** average (1 / 5 / 15 min) {_loads(m.load_average)} before, "
        f"{_loads(info.load_after)} after; busy cores during the run {busy} "
        "(every process of the machine, from /proc/stat)",
        f"- **Raw results** [`{info.raw}`]({info.raw}); to render this section again from "
        f"them: `python -m bench.run --from-raw {info.raw}`",
    ]
    if info.smoke:
        lines.insert(0, "- **Smoke run** (`--quick`): shows that the bench runs; not a measurement")
    return "\n".join(lines)


@dataclass(frozen=True)
class Section:
    """One generated section: its marker name, title, file and how it is rendered."""

    name: str
    """The marker name and the raw files' prefix (``[\\w.-]+``)."""
    module: str
    """The module that defines this ``Section`` (``--from-raw`` imports it to render)."""
    title: str
    render: Callable[[Any], str]
    """The section's body from the run's raw data alone (so ``--from-raw`` can redo it)."""
    file: str = "BENCHMARKS.md"
    """Where the section goes by default, relative to the repository."""
    about: str = ""
    """What the run measures, printed under the header (e.g. the module doc's tail)."""
    also_write: Callable[[Any, RunInfo], None] | None = None
    """Further outputs derived from the data (a plot, the README's paragraph): called only
    when the section goes into its own file in this repository, never for ``--output``
    elsewhere."""

    def text(self, info: RunInfo, data: Any) -> str:
        """The whole section: title, header, what it measures, body."""
        parts = [f"## {self.title}", header(info), self.about.strip(), self.render(data).strip()]
        return "\n\n".join(p for p in parts if p)


def doc_tail(doc: str | None) -> str:
    """A module docstring from its third paragraph on (after the title and usage)."""
    return doc.split("\n\n", 2)[2].strip() if doc and doc.count("\n\n") >= 2 else ""


def add_record_arguments(p: argparse.ArgumentParser, default_output: str = "BENCHMARKS.md") -> None:
    """``--output``, ``--no-write`` and ``--results-dir``, the same for every section."""
    p.add_argument(
        "--output",
        default=None,
        help=f"the Markdown file to write the section into, relative to the repository "
        f"({default_output}; a --quick run: {shown(SCRATCH_DIR)}/{default_output})",
    )
    p.add_argument(
        "--no-write",
        action="store_true",
        help=f"print only; the raw file goes to {shown(SCRATCH_DIR)}/",
    )
    p.add_argument(
        "--results-dir",
        default=None,
        help=f"where the raw file goes ({shown(RESULTS_DIR)}; a --quick run: {shown(SCRATCH_DIR)})",
    )


class Recording:
    """One run of one section, from the start of its measurement to its published record.

    ``args`` is the section's parsed arguments (:func:`add_record_arguments`, and
    ``quick`` when it has ``--quick``). A ``--quick`` run is a smoke run: unless told
    otherwise it writes under ``bench/out``, never into the committed records.
    """

    def __init__(
        self, section: Section, prog: str, argv: Sequence[str] | None, args: argparse.Namespace
    ) -> None:
        self.section = section
        self.command = command_line(prog, sys.argv[1:] if argv is None else argv)
        self.smoke = bool(getattr(args, "quick", False))
        self.no_write = bool(getattr(args, "no_write", False))
        default_dir = SCRATCH_DIR if self.smoke or self.no_write else RESULTS_DIR
        given_dir = getattr(args, "results_dir", None)
        self.results_dir = repo_path(given_dir) if given_dir else default_dir
        given_out = getattr(args, "output", None)
        if given_out:
            self.output: Path | None = repo_path(given_out)
        elif self.smoke:
            self.output = SCRATCH_DIR / section.file
        else:
            self.output = REPO_ROOT / section.file
        if self.no_write:
            self.output = None
        self.info: RunInfo | None = None
        self.raw_path: Path | None = None

    def __enter__(self) -> Recording:
        self._commit, self._changed = git_state(REPO_ROOT)
        self._machine = Machine.detect()
        self._started = dt.datetime.now(dt.UTC).replace(microsecond=0)
        self._t0, self._busy0 = time.monotonic(), busy_cpu_seconds()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        t1, busy1 = time.monotonic(), busy_cpu_seconds()
        busy = None
        if self._busy0 is not None and busy1 is not None and t1 > self._t0:
            busy = round((busy1 - self._busy0) / (t1 - self._t0), 2)
        name = f"{self.section.name}-{_stamp(self._started)}.json.gz"
        self.raw_path = self.results_dir / name
        self.info = RunInfo(
            name=self.section.name,
            command=self.command,
            commit=self._commit,
            changed=self._changed,
            started=self._started.isoformat(),
            ended=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
            machine=self._machine,
            load_after=load_average(),
            busy_cores=busy,
            raw=shown(self.raw_path),
            smoke=self.smoke,
        )

    def finish(self, data: Any) -> RunInfo:
        """Write the raw file and, unless ``--no-write``, publish the section; the run's info."""
        if self.info is None or self.raw_path is None:
            raise RuntimeError("Recording.finish() must follow the end of its `with` block")
        saved = save_raw(self.raw_path, self.info, self.section.module, data)
        print(f"raw results: {shown(self.raw_path)} ({self.raw_path.stat().st_size:,} bytes)")
        if self.output is not None:  # rendered from what the raw file holds, as --from-raw does
            publish(self.section, self.info, saved, self.output)
            print(f"wrote section {self.section.name!r} of {shown(self.output)}")
        return self.info


# -- raw files --------------------------------------------------------------------------------


def save_raw(path: Path, info: RunInfo, module: str, data: Any) -> Any:
    """Write the raw file (compact JSON, gzip, the same bytes for the same content); the
    data as the file holds it (JSON's types: tuples become lists, keys strings)."""
    doc = {"format": RECORD_FORMAT, "module": module, "run": info.to_dict(), "data": data}
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True, default=_jsonable)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    tmp.replace(path)
    return json.loads(text)["data"]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # a numpy scalar
        return value.item()
    if isinstance(value, set | frozenset):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"raw data must be JSON: {type(value).__name__} {value!r:.80}")


def load_raw(path: Path) -> tuple[str, RunInfo, Any]:
    """``(module, info, data)`` of a raw file; ValueError naming what is wrong otherwise."""
    try:
        doc = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path} is not a gzip'd JSON raw file: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
        raise ValueError(
            f"{path} is not a raw file of format {RECORD_FORMAT} (written by bench/record.py); "
            "raw files of runs before issue 30 cannot be rendered again"
        )
    return doc["module"], RunInfo.from_dict(doc["run"]), doc["data"]


def rerender(path: Path, output: Path | None = None, *, write: bool = True) -> tuple[Path, str]:
    """Render a section again from its raw file alone: the file it belongs in, and its text.

    The section's module is imported (only ``bench.*`` and ``reliability.*``) for its
    ``SECTION``; the header is the run's own, naming ``path`` as its raw file. ``write``:
    publish it into that file (else nothing is written).
    """
    module, info, data = load_raw(path)
    if not module.startswith(("bench.", "reliability.")):
        raise ValueError(f"{path} names module {module!r}: only bench.* and reliability.* render")
    section = section_of(module, info.name)
    info = replace(info, raw=shown(path))
    target = output or REPO_ROOT / section.file
    text = publish(section, info, data, target) if write else section.text(info, data)
    return target, text


def section_of(module: str, name: str) -> Section:
    """The :class:`Section` called ``name`` that ``module`` defines."""
    mod = importlib.import_module(module)
    sections = [v for v in vars(mod).values() if isinstance(v, Section) and v.name == name]
    if not sections:
        raise ValueError(f"module {module} has no Section named {name!r}")
    return sections[0]


# -- the Markdown files -----------------------------------------------------------------------

_NAME = re.compile(r"[\w.-]+")


def _marked(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return re.compile(
        rf"^<!-- generated: {n}(?: [^\n]*)? -->\n.*?^<!-- end: {n} -->\n?", re.S | re.M
    )


def begin_marker(name: str) -> str:
    return f"<!-- generated: {name} (bench/record.py writes this section whole: edit the code) -->"


def write_section(path: Path, name: str, text: str, preamble: str = "") -> None:
    """Put ``text`` between section ``name``'s markers in ``path``; keep the rest byte for byte.

    An existing section is replaced whole in place; a new one is appended at the end. A
    missing file starts with ``preamble``. Written atomically (temp file + rename).
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"section name must match [\\w.-]+, got {name!r}")
    old = path.read_text() if path.exists() else preamble
    block = f"{begin_marker(name)}\n{text.strip()}\n<!-- end: {name} -->\n"
    found = list(_marked(name).finditer(old))
    if len(found) > 1:
        raise ValueError(f"{path} has section {name!r} {len(found)} times; keep one and rerun")
    if found:
        new = old[: found[0].start()] + block + old[found[0].end() :]
    else:
        new = (old.rstrip("\n") + "\n\n" if old.strip() else "") + block
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new)
    tmp.replace(path)


def generated_names(text: str) -> list[str]:
    """The names of the generated sections of a file's text, in order."""
    return re.findall(r"^<!-- generated: ([\w.-]+)", text, re.M)


PREAMBLES = {
    name: f"# {title}\n\nEvery section below is generated; see bench/record.py.\n"
    for name, title in (("BENCHMARKS.md", "Benchmarks"), ("RELIABILITY.md", "Reliability runs"))
}
"""What a new records file starts with (the repository's own have their hand-written top)."""


def publish(section: Section, info: RunInfo, data: Any, output: Path) -> str:
    """Write ``section`` of this run into ``output`` (and its further outputs, when
    ``output`` is the section's own file in this repository); the section's text."""
    preamble = PREAMBLES.get(output.name, "")
    text = section.text(info, data)
    write_section(output, section.name, text, preamble)
    own = (REPO_ROOT / section.file).resolve()
    if section.also_write is not None and output.resolve() == own:
        section.also_write(data, info)
    return text
