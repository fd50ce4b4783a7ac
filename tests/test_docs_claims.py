"""What the docs name exists: config keys, cited files and tests, command lines the CLI accepts.

- Every ``spark.receivers.*`` and ``spark.streaming.*`` key named in README.md, docs/*.md,
  docs/decisions/*.md, the Unreleased section of CHANGELOG.md and the package's source
  (docstrings, comments, messages) is a key of :class:`StreamingConfig`, or an old name
  of one that is still read; ``spark.receivers.ui.*`` stands for the keys under it.
- Every file a doc or a decision cites (``spark_receivers/...``, ``docs/...``,
  ``tests/...``, ``bench/...``; ``driver/x.py`` and the like inside the package), every
  test it cites (``tests/x.py::test_y``) and every relative link exists. CHANGELOG.md is
  not checked: it tells of files that were removed or renamed.
- Every ``spark-receivers`` command in a shell block, or in an inline code span with
  options (``spark-receivers ingest`` alone names the command), is accepted by the CLI
  without starting Spark: its argument parser, then ``ingest``'s own checks of URIs,
  sinks, durations and settings (``plan_ingest``), or ``demo``'s up to the point it
  would start Spark.
- Every ``spark-submit`` with ``--archives`` in client mode follows docs/deploy.md's rule,
  and deploy.md says of each recipe whether a test runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from test_docs import DOCS, NODE_ID, ROOT, doc_blocks, node_exists

from spark_receivers.cli.app import build_parser
from spark_receivers.cli.demo import run as run_demo
from spark_receivers.cli.ingest import plan_ingest
from spark_receivers.config import StreamingConfig

# --- config keys ---------------------------------------------------------------------------

KEY = re.compile(r"spark\.(?:receivers|streaming)(?:\.\w+)+(?:\.\*)?")


def config_keys() -> set[str]:
    keys = set()
    for f in dataclasses.fields(StreamingConfig):
        keys.add(f.metadata["spark_key"])
        if f.metadata.get("old_key"):
            keys.add(f.metadata["old_key"])
    return keys


def unreleased(text: str) -> str:
    """The Unreleased section of the CHANGELOG."""
    start = text.index("## Unreleased")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def key_sources() -> dict[str, str]:
    sources = {doc: (ROOT / doc).read_text() for doc in DOCS}
    sources["CHANGELOG.md"] = unreleased((ROOT / "CHANGELOG.md").read_text())
    for path in sorted((ROOT / "spark_receivers").rglob("*.py")):
        sources[str(path.relative_to(ROOT))] = path.read_text()
    return sources


def unknown_keys(sources: dict[str, str], keys: set[str]) -> list[str]:
    unknown = []
    for name, text in sources.items():
        for m in KEY.finditer(text):
            key = m.group(0)
            prefix = key.removesuffix("*")
            known = any(k.startswith(prefix) for k in keys) if prefix != key else key in keys
            if not known:
                unknown.append(f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {key}")
    return unknown


def test_the_key_finder_finds_keys_and_prefixes():
    keys = {"spark.receivers.ui.enabled", "spark.streaming.blockInterval"}
    text = (
        "set `spark.streaming.blockInterval`. Not spark.receivers.ui.port, nor "
        "spark.receivers.metrics.*; spark.receivers.ui.* is fine.\n"
    )
    assert unknown_keys({"x.md": text}, keys) == [
        "x.md:1: spark.receivers.ui.port",
        "x.md:1: spark.receivers.metrics.*",
    ]


def test_every_config_key_the_docs_and_the_package_name_exists():
    assert unknown_keys(key_sources(), config_keys()) == []


# --- cited files and tests -----------------------------------------------------------------

TOP = "spark_receivers|docs|bench|tests|scripts|examples|reliability"
PACKAGE = "cli|driver|receiver|receivers|rpc|spark|util|wal"
PATH = re.compile(rf"(?<![\w/.<$-])((?:{TOP}|{PACKAGE})/[\w./*-]*[\w*/])(?:::(\w+))?")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def is_scratch(path: str) -> bool:
    """True for a path git ignores on purpose (``bench/out/``: made by runs, never committed)."""
    done = subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", path.rstrip("/") + "/"],
        cwd=ROOT,
        check=False,
    )
    return done.returncode == 0


def cited(doc: str) -> list[tuple[int, str, bool]]:
    """(line, what, exists) of every path, test and relative link ``doc`` names."""
    text = (ROOT / doc).read_text()
    found = []
    for m in PATH.finditer(text):
        path, test = m.group(1), m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        if test:
            found.append((line, f"{path}::{test}", node_exists(f"{path}::{test}")))
            continue
        options = [path] if path.startswith(tuple(TOP.split("|"))) else [f"spark_receivers/{path}"]
        if path.startswith("docs/decisions/") and not path.endswith((".md", "/")):
            options = [f"{path}-*.md"]  # docs/decisions/0006
        exists = any(list(ROOT.glob(option.rstrip("/"))) for option in options)
        found.append((line, path, exists or is_scratch(path)))
    for m in LINK.finditer(text):
        target = m.group(1).split("#")[0]
        if target and not re.match(r"\w+:", target):
            line = text.count("\n", 0, m.start()) + 1
            found.append((line, target, ((ROOT / doc).parent / target).exists()))
    return found


def test_every_file_and_test_a_doc_or_decision_cites_exists():
    missing = [f"{doc}:{line}: {what}" for doc in DOCS for line, what, ok in cited(doc) if not ok]
    assert missing == []
    everything = [what for doc in DOCS for _, what, _ in cited(doc)]
    assert (
        "spark_receivers/driver/batches/batch_reader.py" in everything
        or "driver/batches/batch_reader.py" in everything
    )
    assert any("::" in what for what in everything)


# --- command lines -------------------------------------------------------------------------

SYNOPSES = {
    "spark-receivers ingest --source URI --sink SINK [flags]": "URI, SINK and [flags] stand "
    "for what the tables below them list",
}
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a shell block, continuation lines joined, comments dropped."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"\w+=\S*", words[0]):
            words = words[1:]  # VAR=value command ...
        if words:
            commands.append(words)
    return commands


def cli_argv(words: list[str]) -> list[str] | None:
    """The arguments of a ``spark-receivers`` (or ``python -m spark_receivers``) command."""
    if words and Path(words[0]).name == "spark-receivers":
        return words[1:]
    if words[:3] in (["python", "-m", "spark_receivers"], ["python3", "-m", "spark_receivers"]):
        return words[3:]
    return None


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every ``spark-receivers`` command in the docs' blocks and code spans."""
    found = []
    for doc in DOCS:
        for block in doc_blocks(doc):
            if block.language == "bash":
                for words in shell_commands(block.code):
                    argv = cli_argv(words)
                    if argv is not None:
                        found.append((block.where, argv))
        text = (ROOT / doc).read_text()
        for m in CODE_SPAN.finditer(text):
            span = m.group(1)
            if span.startswith("spark-receivers ") and " -" in span and span not in SYNOPSES:
                found.append(
                    (f"{doc}:{text.count(chr(10), 0, m.start()) + 1}", shlex.split(span)[1:])
                )
    return found


class _WouldStartSpark(Exception):
    pass


def refuse_to_start(settings: Any) -> Any:
    raise _WouldStartSpark(settings.master)


def accepted(argv: list[str]) -> str | None:
    """None when the CLI accepts ``argv`` up to starting Spark, else what it said."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = build_parser().parse_args(argv)
    except SystemExit as e:
        return None if e.code == 0 else err.getvalue().strip()  # 0: --help, --version
    try:
        if args.command == "ingest":
            plan_ingest(args)
        else:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                run_demo(args, start=refuse_to_start)
    except _WouldStartSpark:
        return None
    except Exception as e:  # what the CLI would print, for the test's message
        return f"{type(e).__name__}: {e}"
    return None


def test_the_cli_check_refuses_what_the_cli_refuses():
    assert accepted(["ingest", "--source", "generator://?rate=10", "--sink", "console"]) is None
    assert accepted(["demo", "--seconds", "2s"]) is None
    assert "port" in str(accepted(["ingest", "--source", "socket://h:99999", "--sink", "console"]))
    assert accepted(["ingest", "--source", "...", "--sink", "console"]) is not None
    assert accepted(["ingest", "--source", "generator://", "--sink", "kafka:x"]) is not None
    assert accepted(["demo", "--rate", "nan"]) is not None
    assert accepted(["demo", "--bogus"]) is not None


def test_every_spark_receivers_command_in_the_docs_is_accepted(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # demo sets it when unset
    commands = documented_commands()
    refused = [
        f"{where}: spark-receivers {shlex.join(argv)}: {why}"
        for where, argv in commands
        if (why := accepted(argv))
    ]
    assert refused == []
    assert len(commands) >= 10
    assert {argv[0] for _, argv in commands} >= {"ingest", "demo"}


# --- docs/deploy.md: client mode with --archives, and which recipes are tested ------------


def submit_commands() -> list[tuple[str, list[str], str]]:
    """(where, words, the block's text before it) of every ``spark-submit`` in the docs."""
    found = []
    for doc in DOCS:
        for block in doc_blocks(doc):
            if block.language != "bash":
                continue
            before = ""
            for words in shell_commands(block.code):
                if Path(words[0]).name == "spark-submit":
                    found.append((block.where, words, before))
                before += shlex.join(words) + "\n"
        text = (ROOT / doc).read_text()
        for m in CODE_SPAN.finditer(" ".join(text.split("\n"))):
            if m.group(1).startswith("spark-submit "):
                found.append((f"{doc} (inline)", shlex.split(m.group(1)), ""))
    return found


def archive_rule_broken(words: list[str], before: str) -> str | None:
    """docs/deploy.md's rule for ``--archives`` in client mode, or None when it is kept.

    With ``spark.pyspark.python`` relative to an unpacked archive and the driver on this
    side (client mode, the default), the driver needs the archive unpacked in its working
    directory and a Python of its own (``spark.pyspark.driver.python``).
    """
    options = {w for i, w in enumerate(words) if i and words[i - 1] in ("--conf", "--deploy-mode")}
    archives = [words[i + 1] for i, w in enumerate(words) if w == "--archives"]
    relative = [o for o in options if o.startswith("spark.pyspark.python=./")]
    if not archives or not relative or "cluster" in options:
        return None
    archive, _, alias = archives[0].partition("#")
    if not any(o.startswith("spark.pyspark.driver.python=") for o in options):
        return "client mode needs --conf spark.pyspark.driver.python=..."
    if not re.search(rf"tar -xzf {re.escape(archive)} -C {re.escape(alias)}\b", before):
        return f"client mode needs the archive unpacked first: tar -xzf {archive} -C {alias}"
    return None


def test_the_archive_rule_refuses_a_client_mode_submit_without_its_two_steps():
    words = shlex.split(
        "spark-submit --master yarn --deploy-mode client --archives env.tar.gz#env "
        "--conf spark.pyspark.python=./env/bin/python app.py"
    )
    assert "driver.python" in str(archive_rule_broken(words, ""))
    with_driver = [*words[:-1], "--conf", "spark.pyspark.driver.python=/usr/bin/python3", "app.py"]
    assert "tar -xzf" in str(archive_rule_broken(with_driver, ""))
    assert archive_rule_broken(with_driver, "tar -xzf env.tar.gz -C env\n") is None
    cluster = [w if w != "client" else "cluster" for w in words]
    assert archive_rule_broken(cluster, "") is None


def test_every_client_mode_submit_with_archives_follows_the_guides_rule():
    commands = submit_commands()
    broken = [
        f"{where}: {shlex.join(words)}: {why}"
        for where, words, before in commands
        if (why := archive_rule_broken(words, before))
    ]
    assert broken == []
    assert sum("--archives" in words for _, words, _ in commands) >= 2


def deploy_sections() -> dict[str, str]:
    text = (ROOT / "docs" / "deploy.md").read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_deploy_says_of_each_recipe_whether_a_test_runs_it():
    """A section with a recipe says **Tested** (naming the test) or **Untested**."""
    sections = deploy_sections()
    recipes = [title for title, body in sections.items() if "```bash" in body]
    unmarked = [t for t in recipes if not re.search(r"\*\*(Tested|Untested)\b", sections[t])]
    assert unmarked == []
    assert re.search(r"\*\*Untested\b[^\n]*YARN", sections["YARN and Kubernetes"])
    assert re.search(r"\*\*Untested\b[^\n]*Kubernetes", sections["YARN and Kubernetes"])
    paragraphs = [p for body in sections.values() for p in body.split("\n\n") if "**Tested" in p]
    assert paragraphs and [p for p in paragraphs if not NODE_ID.search(p)] == []


# --- README: what `make test` needs ---------------------------------------------------------


def test_readme_names_the_packages_make_test_installs_and_where_the_cli_is():
    script = (ROOT / "scripts" / "services.sh").read_text()
    (cases,) = re.findall(r"^package_of\(\) \{(.*?)^\}", script, re.S | re.M)
    packages = {p for line in re.findall(r"\) echo ([^;]+);;", cases) for p in line.split()}
    assert packages >= {"redis-server", "mosquitto", "chromium", "chromium-driver"}
    readme = (ROOT / "README.md").read_text()
    assert [p for p in sorted(packages) if f"`{p}`" not in readme] == []
    assert "apt-get" in readme and "sudo" in readme
    assert "`.venv/bin/spark-receivers`" in readme
