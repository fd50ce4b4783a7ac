"""Ctrl-C reaches a main thread that waits, whichever thread the kernel gave the signal to."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import signal, threading, time
    from spark_receivers.util.signals import wait_event

    wake = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: wake.set())
    other = threading.Thread(target=time.sleep, args=(60,), daemon=True)
    other.start()

    def send():
        time.sleep(0.5)
        # As Linux may do with kill(pid, SIGINT): the signal lands on another thread.
        signal.pthread_kill(other.ident, signal.SIGINT)

    threading.Thread(target=send, daemon=True).start()
    woke = {WAIT}
    print("woke" if woke else "timed out", flush=True)
    """
)


def run(wait: str, timeout_s: float) -> str | None:
    code = SCRIPT.replace("{WAIT}", wait)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return None
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_signal_another_thread_took_wakes_wait_event():
    assert run("wait_event(wake)", timeout_s=60) == "woke"
    assert run("wait_event(wake, 30.0)", timeout_s=60) == "woke"


def test_a_plain_wait_without_timeout_misses_it_which_is_why_wait_event_exists():
    """The premise, on this platform: Event.wait() never returns (the process is killed)."""
    if sys.platform != "linux":
        pytest.skip("the delivery of a process's signal to a thread is Linux's")
    assert run("wake.wait()", timeout_s=5) is None


def test_wait_event_times_out_with_the_event_unset():
    assert run("wait_event(threading.Event(), 1.0)", timeout_s=60) == "timed out"
