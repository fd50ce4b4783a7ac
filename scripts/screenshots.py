"""The README's two screenshots, taken from real runs (issue 21).

    .venv/bin/python scripts/screenshots.py

1. ``docs/img/status-page.png``: ``spark-receivers demo`` (what ``make demo`` runs) with its
   status page on a free port; once batches went through, Debian's headless Chromium
   (``scripts/services.sh install chromium``) loads the page and takes the screenshot.
2. ``docs/img/terminal-view.png``: ``spark-receivers ingest`` in a real terminal (tmux,
   150x42); its screen, colours included (``capture-pane -e``), is rendered to SVG by rich
   and photographed by the same Chromium.

Every process it starts runs on loopback and is stopped by its PID (tmux: by its session).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from browser import chromium  # noqa: E402 - the tests' launcher of Debian's Chromium

IMG = ROOT / "docs" / "img"
CLI = [sys.executable, "-m", "spark_receivers"]
ENV = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


def wait_for(predicate, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` (another process's output) until it holds; exit on timeout."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout_s:.0f}s waiting for {what}"
            raise SystemExit(msg)
        time.sleep(0.5)


def batches_with_input(url: str) -> int:
    """Completed batches with records, as the page's own API says."""
    with urllib.request.urlopen(url + "api/v1/batches", timeout=10) as r:
        return sum(1 for b in json.load(r) if b["inputSize"] > 0)


def caught_up(url: str) -> bool:
    """The last completed batch started within one batch interval of its time."""
    with urllib.request.urlopen(url + "api/v1/batches?limit=1", timeout=10) as r:
        last = json.load(r)
    with urllib.request.urlopen(url + "api/v1/statistics", timeout=10) as r:
        interval = json.load(r)["batchDuration"]
    return bool(last) and (last[0]["schedulingDelay"] or 0) < interval


def status_page() -> None:
    """``docs/img/status-page.png`` from a real ``demo`` run."""
    log = Path(tempfile.mkstemp(prefix="demo-", suffix=".log")[1])
    # Gentle on a shared 2-core machine: what the page shows must be a stream keeping up.
    cmd = [*CLI, "demo", "--seconds", "400", "--rate", "3000", "--batch-interval", "2s",
           "--conf", "spark.receivers.ui.port=0"]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)
    try:
        wait_for(lambda: "status page http" in log.read_text(), 180, "the status page")
        url = re.search(r"status page (http://\S+)", log.read_text()).group(1)
        wait_for(lambda: batches_with_input(url) >= 12, 300, "12 batches with records")
        try:  # the start-up backlog drained, if the machine lets it within a few minutes
            wait_for(lambda: caught_up(url), 240, "no scheduling delay")
        except SystemExit as e:
            print(f"taking the screenshot anyway: {e}")
        with chromium() as browser:
            browser.get(url)
            time.sleep(5)  # two refreshes of the page: charts and tables drawn
            height = browser.execute_script("return document.body.scrollHeight")
            browser.set_window_size(1400, min(int(height) + 40, 1600))
            time.sleep(2.5)
            browser.save_screenshot(str(IMG / "status-page.png"))
        print(f"wrote {IMG / 'status-page.png'} from {url}")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.unlink(missing_ok=True)


def terminal_view() -> None:
    """``docs/img/terminal-view.png`` from a real ``ingest`` run in tmux."""
    from rich.console import Console
    from rich.text import Text

    session = f"sr-shot-{os.getpid()}"
    out = tempfile.mkdtemp(prefix="sr-shot-out-")
    argv = [*CLI, "ingest", "--source", "'generator://?rate=3000'", "--sink", f"parquet:{out}",
            "--batch-interval", "2s", "--seconds", "240",
            "--conf", "spark.receivers.ui.port=0"]  # fmt: skip
    ingest = " ".join(argv)
    env = " ".join(f"{k}={ENV[k]}" for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON"))
    tmux = ["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "42",
            f"cd {ROOT} && env {env} {ingest}; sleep 600"]  # fmt: skip
    subprocess.run(tmux, check=True)
    try:

        def screen(colours: bool = False) -> str:
            flags = ["-e"] if colours else []
            return subprocess.run(
                ["tmux", "capture-pane", *flags, "-p", "-t", session],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip

        wait_for(lambda: "processing " in screen() and "ACTIVE" in screen(), 300, "the view")
        wait_for(lambda: re.search(r"batches ([1-9]\d|\d{3,}) \(", screen()), 300, "10 batches")
        console = Console(record=True, width=150, file=open(os.devnull, "w"))  # noqa: SIM115
        shown = screen(colours=True).rstrip("\n").splitlines()
        first = next((i for i, line in enumerate(shown) if "ingesting " in line), 0)
        console.print(Text.from_ansi("\n".join(shown[first:])))  # the JVM's start-up lines cut
        svg = Path(tempfile.mkdtemp(prefix="sr-shot-svg-")) / "terminal.svg"
        text = console.export_svg(title="spark-receivers ingest")
        box = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', text)
        if box:  # its own size, not the window's
            text = text.replace("<svg ", f'<svg width="{box[1]}" height="{box[2]}" ', 1)
        svg.write_text(text)
        with chromium() as browser:
            browser.set_window_size(1400, 900)
            browser.get(svg.as_uri())
            time.sleep(1)
            size = browser.execute_script(
                "const r = document.querySelector('svg').getBoundingClientRect();"
                "return [Math.ceil(r.width), Math.ceil(r.height)];"
            )
            browser.set_window_size(int(size[0]) + 20, int(size[1]) + 140)
            time.sleep(1)
            browser.find_element("css selector", "svg").screenshot(str(IMG / "terminal-view.png"))
        print(f"wrote {IMG / 'terminal-view.png'}")
    finally:
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=False)
        time.sleep(10)  # a graceful stop of the ingest
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


if __name__ == "__main__":
    which = sys.argv[1:] or ["status", "terminal"]
    if "status" in which:
        status_page()
    if "terminal" in which:
        terminal_view()
