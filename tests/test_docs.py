"""The docs are true: every Python snippet of the README and docs/testing.md runs, every
example runs, the generated references are fresh and the API reference builds.

Snippets run as written, in a fresh namespace, with three kinds of substitution listed in
SUBSTITUTIONS: a fixed-time run becomes a bounded wait until data went through (on a busy
machine 10 s may not see a first batch; then the snippet stops as written), paths go to a
temporary directory, and the snippet that reads a TCP feed gets a real local line server.
Snippets that start Spark run on the shared local session (marked ``spark``). Blocks in
other languages are not run; NOT_RUN says why for each language.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import spark_receivers
from spark_receivers import LineSource
from spark_receivers.testing import StandInTracker, supervise

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "docs/testing.md"]
NOT_RUN = {
    "bash": "shell commands (make targets, pip installs, the CLI): not Python; the CLI's "
    "commands are run by tests/test_ingest.py and tests/integration/test_ingest_crash.py",
    "": "diagrams and plain text",
}
SUBSTITUTIONS: list[tuple[str, str]] = [
    ("ssc.await_termination(timeout_s=10)", "until_processed(ssc)"),  # Ticker, union
    ("query.awaitTermination(30)", "until_read(query)"),  # the Structured snippet
    ("/tmp/sr-readme", "{tmp}"),  # its checkpoint and output paths
    ('("feed.example", 9999)', "({host!r}, {port})"),  # the ThreadedReceiver snippet's feed
]
EXAMPLE_ARGS = {
    "structured_streaming.py": ["--seconds", "12", "--checkpoint", "{tmp}/ckpt"],
}


def blocks(doc: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of ``doc``."""
    text = (ROOT / doc).read_text()
    return re.findall(r"^```([\w-]*)\n(.*?)^```", text, re.S | re.M)


def snippets() -> list[Any]:
    params = []
    for doc in DOCS:
        for i, (language, code) in enumerate(blocks(doc)):
            if language != "python":
                continue
            marks = [pytest.mark.spark] if "SparkSession" in code else []
            params.append(pytest.param(doc, code, marks=marks, id=f"{doc}#{i}"))
    return params


def test_every_block_is_run_or_has_a_reason_not_to_be():
    languages = {language for doc in DOCS for language, _ in blocks(doc)}
    assert languages <= {"python", *NOT_RUN}, languages - {"python", *NOT_RUN}
    assert len(snippets()) >= 8


# --- waits instead of fixed durations, and checks after a snippet ran --------------------

WAIT_S = 180


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {WAIT_S}s waiting for {what}"
        time.sleep(0.2)


def until_processed(ssc: Any) -> None:
    """Every receiver stored records and a batch processed some."""

    def done() -> bool:
        status = ssc.status()
        assert status.failure is None, status.failure
        return status.records_processed > 0 and all(r.records > 0 for r in status.receivers)

    wait_until(done, "every receiver's records in a processed batch")


def until_read(query: Any) -> None:
    """The query read rows."""

    def done() -> bool:
        assert query.exception() is None, query.exception()
        return sum(p["numInputRows"] for p in query.recentProgress) > 0

    wait_until(done, "the query to read rows")


def check_ticker(ns: dict[str, Any], env: dict[str, Any]) -> None:
    status = ns["ssc"].status()
    assert status.records_received > 0
    assert status.records_processed == status.records_received  # graceful: all processed


def check_union(ns: dict[str, Any], env: dict[str, Any]) -> None:
    status = ns["ssc"].status()
    assert len(status.receivers) == 2 and all(r.records > 0 for r in status.receivers)
    assert status.records_processed > 0


def check_clicks(ns: dict[str, Any], env: dict[str, Any]) -> None:
    rows = sum(p["numInputRows"] for p in ns["query"].recentProgress)
    assert rows > 0, "the query read nothing"
    assert ns["query"].exception() is None


def check_lines(ns: dict[str, Any], env: dict[str, Any]) -> None:
    """Run the README's ThreadedReceiver against the line server, under the real supervisor."""
    tracker = StandInTracker()
    try:
        sup = supervise(tracker, ns["Lines"]())
        sup.start()
        tracker.wait_for(lambda: tracker.records() >= 500, timeout_s=30)
        lines = tracker.stored_table(sup).column("value").to_pylist()
        assert all(line and not line.endswith("\n") for line in lines)
        tracker.release(sup)
        assert sup.await_termination(15)
    finally:
        tracker.close()


def check_status_page(ns: dict[str, Any], env: dict[str, Any]) -> None:
    ssc = ns["ssc"]
    assert ssc.status_page_url is None  # served while it ran, gone with the context
    assert ssc.last_progress is not None and ssc.status().records_processed > 0
    assert ssc.last_progress["batchId"] == ssc.last_progress.batch_id


CHECKS: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
    "StreamingConfig(ui_enabled=True": check_status_page,
    "class Ticker(Receiver)": check_ticker,
    "ssc.union(*streams)": check_union,
    "class Clicks(Receiver)": check_clicks,
    "class Lines(ThreadedReceiver)": check_lines,
}


@pytest.mark.parametrize(("doc", "code"), snippets())
def test_snippet_runs(doc, code, request, tmp_path):
    if "SparkSession" in code:
        request.getfixturevalue("spark")  # the shared session: the snippet's getOrCreate gets it
    with LineSource(rate=5000) as source:
        env = {"tmp": str(tmp_path), "host": source.host, "port": source.port}
        for old, new in SUBSTITUTIONS:
            code = code.replace(old, new.format(**env))
        namespace: dict[str, Any] = {
            "__name__": f"doc_snippet_{abs(hash(code))}",
            "until_processed": until_processed,
            "until_read": until_read,
        }
        exec(compile(code, f"{doc} snippet", "exec"), namespace)
        for marker, check in CHECKS.items():
            if marker in code:
                check(namespace, env)


def test_every_check_matches_a_snippet():
    code = "".join(c for doc in DOCS for language, c in blocks(doc) if language == "python")
    assert [m for m in CHECKS if m not in code] == []


# --- examples ------------------------------------------------------------------------------


def test_every_example_has_arguments_for_a_short_run():
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == sorted(EXAMPLE_ARGS)


@pytest.mark.spark
@pytest.mark.parametrize("example", sorted(EXAMPLE_ARGS))
def test_example_runs(example, tmp_path):
    args = [a.format(tmp=tmp_path) for a in EXAMPLE_ARGS[example]]
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


# --- generated references ---------------------------------------------------------------


def docs_script():
    spec = importlib.util.spec_from_file_location("docs_script", ROOT / "scripts" / "docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_and_errors_references_are_fresh():
    assert docs_script().main(["--check"]) == 0, "run `make docs` and commit docs/*.md"


def test_config_reference_has_every_key_with_default_unit_and_spark_key():
    import dataclasses

    from spark_receivers.config import StreamingConfig

    text = (ROOT / "docs" / "config.md").read_text()
    for f in dataclasses.fields(StreamingConfig):
        (row,) = [line for line in text.splitlines() if line.startswith(f"| `{f.name}` |")]
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[1].startswith(f"`{f.metadata['spark_key']}`")
        assert cells[2] and cells[3] and cells[4], row


def test_api_reference_builds_with_every_public_name(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        docs_script().build_api(tmp_path)
    assert [str(w.message) for w in caught if "pdoc" in str(w.filename)] == []
    page = (tmp_path / "spark_receivers.html").read_text()
    missing = [name for name in spark_receivers.__all__ if f'id="{name}"' not in page]
    assert missing == []
    assert (tmp_path / "spark_receivers" / "testing.html").exists()
