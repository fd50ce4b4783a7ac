"""The docs are true: every code block of the README and of docs/ runs or says in its doc
why not, every example runs, the generated references are fresh, the API reference builds
and every type the context hands out is public.

Blocks are the fenced blocks of DOCS (README.md, docs/*.md, docs/decisions/*.md), also
those indented in a list. On the lines right above its fence a block may carry a marker
the tests read: ``<!-- not run: why -->`` (no test can run it here: a cluster, a library
we do not depend on) or ``<!-- run: tests/x.py::test_y ... -->`` (the test that runs it,
when it is not this module's snippet runner). No block is skipped without one.

- ``python`` blocks run as written in a fresh namespace, with the substitutions listed in
  SUBSTITUTIONS: a fixed-time run becomes a bounded wait until data went through (on a
  busy machine 10 s may not see a first batch; then the snippet stops as written), paths
  go to a temporary directory, ports and servers to real local ones (a line server, a
  free port, redis-server, mosquitto). Snippets that start Spark run on the shared local
  session (marked ``spark``). docs/receivers.md's snippets continue a program that has
  ``spark`` and ``ssc``: the runner gives them those, starts the context when the snippet
  does not, feeds the receiver's source (FEEDS) and checks what arrived. A ``not run``
  block is compiled, so its syntax cannot rot.
- ``bash`` blocks must carry a marker and pass ``bash -n``; every ``spark-receivers``
  command in them is accepted by the CLI (tests/test_docs_claims.py).
- ``text`` and unlabelled blocks are output samples and diagrams, not code (NOT_CODE).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import threading
import time
import typing
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import spark_receivers
from spark_receivers import LineSource
from spark_receivers.testing import StandInTracker, supervise

sys.path.insert(0, str(Path(__file__).resolve().parent / "receivers"))
from service_fixtures import mosquitto_port, redis_url  # noqa: F401  (fixtures of FEEDS)

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    "README.md",
    *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
    *sorted(f"docs/decisions/{p.name}" for p in (ROOT / "docs" / "decisions").glob("*.md")),
]
NOT_CODE = {"text": "output samples", "": "diagrams and output samples"}
FRAGMENT_DOCS = {"docs/receivers.md"}
"""Docs whose snippets continue a program that has ``spark`` and ``ssc``."""
SUBSTITUTIONS: list[tuple[str, str]] = [
    ("ssc.await_termination(timeout_s=10)", "until_processed(ssc)"),  # Ticker, union
    ("query.awaitTermination(30)", "until_read(query)"),  # the Structured snippet
    ("/tmp/sr-readme", "{tmp}"),  # its checkpoint and output paths
    ('("feed.example", 9999)', "({host!r}, {port})"),  # the ThreadedReceiver snippet's feed
    ("/tmp/sr-fault-plan.json", "{tmp}/fault-plan.json"),  # docs/testing.md's fault plan
    ("port=8090", "port={http_port}"),  # docs/receivers.md: HttpReceiver
    ('"/var/log/myapp"', "{logs!r}"),  # FileTailReceiver
    ('RedisStreamReceiver("orders"', "RedisStreamReceiver({redis_stream!r}"),
    ('url="redis://127.0.0.1:6379/0"', "url={redis_url!r}"),
    ('MqttReceiver("127.0.0.1", 1883,', 'MqttReceiver("127.0.0.1", {mosquitto_port},'),
]
EXAMPLE_ARGS = {
    "structured_streaming.py": ["--seconds", "12", "--checkpoint", "{tmp}/ckpt"],
}


# --- the blocks of the docs, and the markers above them ----------------------------------

FENCE = re.compile(r"^(?P<indent> *)```(?P<language>[\w-]*)\s*$")
MARKER = re.compile(r"<!--\s*(?P<kind>not run|run):\s*(?P<why>.*?)\s*-->\Z", re.S)
NODE_ID = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")


@dataclass(frozen=True)
class Block:
    """A fenced block: where it is, its language, its code (dedented) and its marker."""

    doc: str
    line: int
    language: str
    code: str
    marker: tuple[str, str] | None
    """(``"run"`` or ``"not run"``, the reason), from the comment right above the fence."""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def runs_here(self) -> bool:
        """A Python block this module runs (not marked ``not run``)."""
        return self.language == "python" and (self.marker is None or self.marker[0] != "not run")


def _marker_above(lines: list[str], fence: int) -> tuple[str, str] | None:
    end = fence - 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return None
    start = end
    while start > 0 and "<!--" not in lines[start]:
        start -= 1
    m = MARKER.search(" ".join(line.strip() for line in lines[start : end + 1]))
    return (m["kind"], " ".join(m["why"].split())) if m else None


def doc_blocks(doc: str) -> list[Block]:
    """Every fenced block of ``doc``, in order."""
    lines = (ROOT / doc).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, end = m["indent"], i + 1
        while end < len(lines) and lines[end] != indent + "```":
            end += 1
        assert end < len(lines), f"{doc}:{i + 1}: a fence that is never closed"
        body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
        code = "\n".join(body) + "\n"
        found.append(Block(doc, i + 1, m["language"], code, _marker_above(lines, i)))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in doc_blocks(doc)]


def node_exists(node: str) -> bool:
    """``tests/x.py::test_y`` names a file of this repository and a function in it."""
    path, _, name = node.partition("::")
    file = ROOT / path
    if not file.is_file():
        return False
    return not name or re.search(rf"^(async )?def {name}\(", file.read_text(), re.M) is not None


def test_every_block_is_run_or_says_in_its_doc_why_not():
    problems = []
    for b in all_blocks():
        if b.marker is not None:
            kind, why = b.marker
            nodes = NODE_ID.findall(why)
            if kind == "run" and not nodes:
                problems.append(f"{b.where}: 'run:' must name the test that runs it")
            if kind == "not run" and len(why.split()) < 3:
                problems.append(f"{b.where}: 'not run:' needs a reason, got {why!r}")
            problems += [
                f"{b.where}: no test {p}::{n}" for p, n in nodes if not node_exists(f"{p}::{n}")
            ]
        if b.language == "python" or b.language in NOT_CODE:
            continue
        if b.language != "bash":
            problems.append(f"{b.where}: a {b.language!r} block: run it, or add it to NOT_CODE")
        elif b.marker is None:
            problems.append(
                f"{b.where}: a bash block needs <!-- not run: why --> or <!-- run: test -->"
            )
    assert problems == []
    assert len(snippets()) >= 14


def test_every_bash_block_parses():
    for b in all_blocks():
        if b.language == "bash":
            done = subprocess.run(["bash", "-n"], input=b.code, capture_output=True, text=True)
            assert done.returncode == 0, f"{b.where}: {done.stderr}"


def test_every_block_marked_not_run_compiles():
    marked = [b for b in all_blocks() if b.language == "python" and not b.runs_here]
    for b in marked:
        compile(b.code, b.where, "exec")
    assert marked, "the Delta Lake recipe of docs/receivers.md is marked not run"


def snippets() -> list[Any]:
    params = []
    for doc in DOCS:
        for i, b in enumerate(doc_blocks(doc)):
            if not b.runs_here:
                continue
            spark = "SparkSession" in b.code or doc in FRAGMENT_DOCS
            marks = [pytest.mark.spark] if spark else []
            params.append(pytest.param(b, marks=marks, id=f"{doc}#{i}"))
    return params


# --- waits instead of fixed durations, and checks after a snippet ran --------------------

WAIT_S = 180


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {WAIT_S}s waiting for {what}"
        time.sleep(0.2)


def processed(ssc: Any) -> bool:
    """Every receiver stored records and a batch processed some (a failure raises)."""
    status = ssc.status()
    assert status.failure is None, status.failure
    return status.records_processed > 0 and all(r.records > 0 for r in status.receivers)


def until_processed(ssc: Any) -> None:
    wait_until(lambda: processed(ssc), "every receiver's records in a processed batch")


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


class Env(dict[str, Any]):
    """The values substitutions take, each made when a snippet first needs it."""

    def __init__(self, makers: dict[str, Callable[[], Any]]) -> None:
        super().__init__()
        self.makers = makers

    def __missing__(self, name: str) -> Any:
        value = self[name] = self.makers[name]()
        return value


def substitute(code: str, env: Env) -> str:
    for old, new in SUBSTITUTIONS:
        if old in code:
            code = code.replace(old, new.format_map(env))
    return code


def env_for(request: Any, tmp_path: Path) -> Env:
    def logs() -> str:
        (tmp_path / "myapp").mkdir()
        return str(tmp_path / "myapp")

    return Env(
        {
            "tmp": lambda: str(tmp_path),
            "http_port": free_port,
            "logs": logs,
            "redis_stream": lambda: f"orders-{uuid.uuid4().hex[:8]}",
            "redis_url": lambda: request.getfixturevalue("redis_url"),
            "mosquitto_port": lambda: request.getfixturevalue("mosquitto_port"),
        }
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("block", snippets())
def test_snippet_runs(block, request, tmp_path):
    if block.doc in FRAGMENT_DOCS:
        run_fragment(block, request.getfixturevalue("spark"), env_for(request, tmp_path))
        return
    if "SparkSession" in block.code:
        request.getfixturevalue("spark")  # the shared session: the snippet's getOrCreate gets it
    with LineSource(rate=5000) as source:
        env = env_for(request, tmp_path)
        env.update(host=source.host, port=source.port)
        code = substitute(block.code, env)
        namespace: dict[str, Any] = {
            "__name__": f"doc_snippet_{abs(hash(code))}",
            "until_processed": until_processed,
            "until_read": until_read,
        }
        exec(compile(code, f"{block.where} snippet", "exec"), namespace)
        for marker, check in CHECKS.items():
            if marker in code:
                check(namespace, env)


# --- docs/receivers.md: fragments of a program, each fed by its source --------------------


def post_http(port: int, token: str, body: bytes) -> tuple[int, Any] | None:
    """POST ``body`` to the HttpReceiver on ``port``; None while nothing listens there."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/ingest", body, {"Authorization": f"Bearer {token}"})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read() or b"null")
    except ConnectionRefusedError:
        return None
    finally:
        conn.close()


Poll = Callable[[list[Any]], bool]
"""Called until it returns True: pushes to the source, says whether ``rows`` (the stream's
values so far, when the runner collects them) hold what it pushed."""


def feed_http(ns: dict[str, Any], env: Env, stack: contextlib.ExitStack) -> Poll:
    """The snippet's own curl, from Python: two JSON lines with its bearer token."""
    answers: list[Any] = []

    def poll(rows: list[Any]) -> bool:
        if not answers:
            answer = post_http(env["http_port"], "s3cret", b'{"a":1}\n{"a":2}\n')
            if answer is not None:
                assert answer == (200, {"stored": 2}), answer
                answers.append(answer)
            return False
        return bool(ns["ssc"].status().records_processed >= 2)

    return poll


def receiver_of(ns: dict[str, Any], cls: type) -> Any:
    """The ``cls`` receiver of the snippet's stream (its settings, after substitution)."""
    from spark_receivers import ReceiverInputStream

    streams = [v for v in ns.values() if isinstance(v, ReceiverInputStream)]
    (receiver,) = [s.receiver for s in streams if isinstance(s.receiver, cls)]
    return receiver


def feed_file_tail(ns: dict[str, Any], env: Env, stack: contextlib.ExitStack) -> Poll:
    """Lines in a file its pattern matches, and a file it does not."""
    from spark_receivers.receivers import FileTailReceiver

    receiver = receiver_of(ns, FileTailReceiver)
    lines = [f"log line {i}" for i in range(200)]
    matching = Path(receiver.directory) / receiver.pattern.replace("*", "app")
    matching.write_text("".join(f"{line}\n" for line in lines))
    (Path(receiver.directory) / "not-matching.tmp").write_text("not read\n")
    return lambda rows: sorted(rows) == sorted(lines)


def feed_redis(ns: dict[str, Any], env: Env, stack: contextlib.ExitStack) -> Poll:
    """Entries added to its stream: each arrives once (the group takes the whole stream)."""
    import redis

    from spark_receivers.receivers import RedisStreamReceiver

    receiver = receiver_of(ns, RedisStreamReceiver)
    client = stack.enter_context(redis.Redis.from_url(receiver.url, decode_responses=True))
    sent = [f"order {i}" for i in range(200)]
    for value in sent:
        client.xadd(receiver.stream, {receiver.field: value})
    return lambda rows: sorted(rows) == sorted(sent)


def feed_mqtt(ns: dict[str, Any], env: Env, stack: contextlib.ExitStack) -> Poll:
    """A reading published (QoS 1) to a topic its filter matches, a poll, until one arrives.

    The receiver subscribes when it starts, so what is published before is not its.
    """
    import paho.mqtt.client as mqtt

    from spark_receivers.receivers import MqttReceiver

    receiver = receiver_of(ns, MqttReceiver)
    topic = receiver.topic.replace("+", "kitchen").replace("#", "docs")
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"docs-{uuid.uuid4().hex}")
    client.connect("127.0.0.1", receiver.port)
    client.loop_start()
    stack.callback(client.loop_stop)
    stack.callback(client.disconnect)
    tag, sent = uuid.uuid4().hex, []

    def poll(rows: list[Any]) -> bool:
        ours = [row for row in rows if tag in row]
        assert set(ours) <= set(sent), ours
        if ours:
            return True
        sent.append(f"21.5 {tag} {len(sent)}")
        client.publish(topic, sent[-1], qos=1).wait_for_publish(10)
        return False

    return poll


def feed_generator(ns: dict[str, Any], env: Env, stack: contextlib.ExitStack) -> Poll:
    return lambda rows: processed(ns["ssc"])


FEEDS: dict[str, Callable[[dict[str, Any], Env, contextlib.ExitStack], Poll]] = {
    "HttpReceiver(": feed_http,
    "FileTailReceiver(": feed_file_tail,
    "RedisStreamReceiver(": feed_redis,
    "MqttReceiver(": feed_mqtt,
    "GeneratorReceiver(": feed_generator,
}


def run_fragment(block: Block, spark: Any, env: Env) -> None:
    """Run a docs/receivers.md snippet on the shared session until its source's data arrived.

    The snippet gets ``spark`` and, unless it makes its own, ``ssc``. A stream it gives no
    output operation gets one that collects its values; the context is started if the
    snippet did not start it, and stopped gracefully at the end.
    """
    from spark_receivers import ContextState, ReceiverInputStream, StreamingContext

    (feed,) = [f for marker, f in FEEDS.items() if marker in block.code]
    code = substitute(block.code, env)
    ns: dict[str, Any] = {"__name__": f"doc_snippet_{abs(hash(code))}", "spark": spark}
    if "ssc = StreamingContext(" not in code:
        ns["ssc"] = StreamingContext(spark, batch_interval_ms=500)
    rows: list[Any] = []
    lock = threading.Lock()

    def collect(df: Any, batch_time_ms: int) -> None:
        values = [row[0] for row in df.collect()]
        with lock:
            rows.extend(values)

    with contextlib.ExitStack() as stack:
        try:
            exec(compile(code, f"{block.where} snippet", "exec"), ns)
            ssc = ns["ssc"]
            if "foreach_batch" not in code:
                streams = [v for v in ns.values() if isinstance(v, ReceiverInputStream)]
                assert streams, "the snippet made no stream"
                for stream in streams:
                    stream.foreach_batch(collect)
            if ssc.state is ContextState.INITIALIZED:
                ssc.start()
            poll = feed(ns, env, stack)

            def arrived() -> bool:
                failure = ssc.status().failure
                assert failure is None, failure
                with lock:
                    return poll(list(rows))

            wait_until(arrived, f"the data fed to {block.where} to be processed")
        finally:
            if "ssc" in ns and ns["ssc"].state is ContextState.ACTIVE:
                ns["ssc"].stop(graceful=True)


def test_every_check_feed_and_substitution_matches_a_snippet():
    code = "".join(p.values[0].code for p in snippets())
    assert [m for m in [*CHECKS, *FEEDS] if m not in code] == []
    assert [old for old, _ in SUBSTITUTIONS if old not in code] == []
    fragments = [p.values[0] for p in snippets() if p.values[0].doc in FRAGMENT_DOCS]
    assert [b.where for b in fragments if sum(m in b.code for m in FEEDS) != 1] == []


# --- docs/deploy.md's TLS recipe --------------------------------------------------------


def deploy_block(containing: str) -> Block:
    (block,) = [b for b in doc_blocks("docs/deploy.md") if containing in b.code]
    return block


def test_the_tls_recipe_makes_certificates_that_its_settings_serve(tmp_path):
    """docs/deploy.md's openssl lines, then its --conf keys as a StreamingConfig, over TLS.

    The certificate names ``spark-receivers`` and two addresses that are not this
    machine's: a call to 127.0.0.1 succeeds only because ``serverName`` says which name to
    check, as the page says.
    """
    import shutil

    from spark_receivers.config import StreamingConfig
    from spark_receivers.errors import RpcError
    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.auth import new_secret
    from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint

    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to run docs/deploy.md's TLS recipe")
    recipe = deploy_block("openssl req -x509").code
    certificates, _, submit = recipe.partition("spark-submit")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", certificates],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    words = shlex.split(submit.replace("\\\n", " "))
    conf = dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--conf")
    conf = {k: v.replace("/etc/sr/", f"{tmp_path}/") for k, v in conf.items()}
    tls = StreamingConfig.from_spark_conf(conf).tls
    assert tls is not None and tls.server_name == "spark-receivers"
    secret, seen = new_secret(), []
    endpoint = FlightEndpoint(
        "docs-tls",
        "127.0.0.1",
        secret,
        m.TRACKER_MESSAGES,
        lambda msg: seen.append(msg) or True,
        tls=tls,
    )
    try:
        client = EndpointClient(endpoint.address, secret, tls=tls)
        assert client.call(m.ReportError(0, "over the recipe's TLS", "")) is True
        client.close()
        by_address = type(tls)(tls.cert_file, tls.key_file, tls.ca_file)  # no serverName
        client = EndpointClient(endpoint.address, secret, timeout_s=5, tls=by_address)
        with pytest.raises(RpcError):
            client.call(m.ReportError(0, "checked against 127.0.0.1", ""))
        client.close()
    finally:
        endpoint.close()
    assert [msg.message for msg in seen] == ["over the recipe's TLS"]


# --- examples ------------------------------------------------------------------------------


RUNNER_EXIT = re.compile(
    r"Traceback \(most recent call last\):\n"
    r"  File \"[^\"]*pyspark/sql/streaming/python_streaming_source_runner\.py\", "
    r"line \d+, in main\n"
    r"  File \"[^\"]*pyspark/serializers\.py\", line \d+, in read_int\n"
    r"EOFError\n"
    r"(?:\nDuring handling of the above exception, another exception occurred:\n\n"
    r"Traceback \(most recent call last\):\n(?:  .*\n)+BrokenPipeError: .*\n)+"
)
"""PySpark's own end of a Python streaming source's runner when its query stops.

The runner (``pyspark/sql/streaming/python_streaming_source_runner.py``) reads calls in a
loop it never leaves; when the query stops, the JVM closes its socket and ends it. If the
runner reads first, it prints EOFError and then BrokenPipeError writing the error back, on
a busy machine every time, on an idle one seldom: not an error of the example's."""


def tracebacks(stderr: str) -> str:
    """``stderr`` without PySpark's runner ending (RUNNER_EXIT): what is left must be clean."""
    return RUNNER_EXIT.sub("", stderr)


def test_only_the_runners_ending_is_left_out_of_an_examples_stderr():
    ending = (
        "Traceback (most recent call last):\n"
        '  File "/x/pyspark/sql/streaming/python_streaming_source_runner.py", line 265, in main\n'
        '  File "/x/pyspark/serializers.py", line 604, in read_int\n'
        "EOFError\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        "    return self._sock.send(b)\n"
        "BrokenPipeError: [Errno 32] Broken pipe\n"
    )
    assert tracebacks(f"WARN a\n{ending}WARN b\n") == "WARN a\nWARN b\n"
    other = ending.replace("EOFError", "ValueError: a real one")
    assert "Traceback" in tracebacks(other)
    assert "Traceback" in tracebacks(ending + ending.replace("read_int", "write_int"))


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
    assert "Traceback" not in tracebacks(result.stderr), result.stderr[-3000:]


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


def returned_classes(tp: Any) -> list[type]:
    """The classes of this package a type hint names, and those their dataclass fields name."""
    import dataclasses

    found: list[type] = []
    todo = [tp]
    while todo:
        t = todo.pop()
        todo += typing.get_args(t)
        if isinstance(t, type) and t.__module__.startswith("spark_receivers") and t not in found:
            found.append(t)
            if dataclasses.is_dataclass(t):
                hints = typing.get_type_hints(t)
                todo += [hints[f.name] for f in dataclasses.fields(t)]
    return found


def test_every_type_the_context_hands_out_is_public():
    """What ``ssc.status()``, ``ssc.last_progress``, ... return can be imported and documented.

    The return types of StreamingContext's public methods and properties, and the types of
    their fields, are in ``spark_receivers.__all__`` (and so in the API reference).
    """
    from spark_receivers import StreamingContext

    hidden = set()
    for name, member in vars(StreamingContext).items():
        function = member.fget if isinstance(member, property) else member
        if name.startswith("_") or not callable(function):
            continue
        hints = typing.get_type_hints(function, localns={"CollectorRegistry": object})
        for cls in returned_classes(hints.get("return")):
            if cls.__name__ not in spark_receivers.__all__:
                hidden.add(f"{cls.__module__}.{cls.__name__} (from StreamingContext.{name})")
    assert sorted(hidden) == []
