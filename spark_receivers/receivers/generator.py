"""``GeneratorReceiver``: generates numbered lines of words at a given rate (tests, benchmarks)."""

from __future__ import annotations

import random
import time
from typing import Any

from spark_receivers.errors import ConfigError
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.receivers.lines import VOCABULARY


def generated_line(seq: int, tails: list[str]) -> str:
    """Line number ``seq`` of a generator whose word tails are ``tails``."""
    return f"{seq} {tails[seq % len(tails)]}"


def make_tails(line_bytes: int, seed: int, count: int = 997) -> list[str]:
    """``count`` random strings of words about ``line_bytes - 10`` long (deterministic)."""
    rng = random.Random(seed)
    tails = []
    for _ in range(count):
        words: list[str] = []
        length = 10
        while length < line_bytes - 8:
            word = rng.choice(VOCABULARY)
            words.append(word)
            length += len(word) + 1
        tails.append(" ".join(words))
    return tails


class GeneratorReceiver(ThreadedReceiver):
    """Stores ``<seq> word word ...`` lines (about ``line_bytes`` long), ``seq`` from 0.

    ``rate`` is in records/s (None: as fast as the pipeline takes them);
    ``total`` bounds the number of records (None: until stopped); after the
    last one the receiver idles until stopped, so that everything is processed.
    Records are stored as lists of up to ``chunk`` lines (one list per 10 ms
    tick when rate-limited), with ``reliable=True`` if ``reliable``. The same
    ``seed`` gives the same lines: :meth:`expected` lists them on the driver.
    A restart goes on from the next number, never repeating one; a failed
    store restarts it with the backoff of :class:`ThreadedReceiver`.
    ``include_timestamp=True`` adds when each line was generated (an event
    time for windowed examples).

    Thread contract: one thread (``generator-receiver-<stream>``) stores;
    it waits on an event between ticks, so ``on_stop`` returns within one store.
    """

    TICK_S = 0.01
    thread_name_prefix = "generator-receiver"
    transient_attrs = ("_tails",)
    supports_timestamp = True
    _tails: list[str] | None = None

    def __init__(
        self,
        rate: float | None = None,
        total: int | None = None,
        *,
        line_bytes: int = 100,
        seed: int = 7,
        chunk: int = 1000,
        reliable: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if rate is not None and rate <= 0:
            msg = f"rate must be > 0 records/s or None, got {rate!r}"
            raise ConfigError(msg)
        if total is not None and total < 0:
            msg = f"total must be >= 0 or None, got {total!r}"
            raise ConfigError(msg)
        if chunk <= 0:
            msg = f"chunk must be > 0, got {chunk!r}"
            raise ConfigError(msg)
        if line_bytes < 1:
            msg = f"line_bytes must be >= 1, got {line_bytes!r}"
            raise ConfigError(msg)
        self.rate = rate
        self.total = total
        self.line_bytes = line_bytes
        self.seed = seed
        self.chunk = chunk
        self.reliable = reliable
        self.records_generated = 0

    def expected(self, n: int | None = None) -> list[str]:
        """The first ``n`` lines (default ``total``) this generator stores, in order."""
        count = self.total if n is None else n
        if count is None:
            msg = "expected() needs n when total is None"
            raise ConfigError(msg)
        tails = make_tails(self.line_bytes, self.seed)
        return [generated_line(i, tails) for i in range(count)]

    def _chunk(self, n: int) -> list[str]:
        tails = self._tails
        assert tails is not None
        start = self.records_generated
        k = len(tails)
        return [f"{seq} {tails[seq % k]}" for seq in range(start, start + n)]

    def _remaining(self) -> int | None:
        return None if self.total is None else self.total - self.records_generated

    def receive(self) -> None:
        """Store the lines, at ``rate``, until ``total`` or until stopped; then idle."""
        if self._tails is None:
            self._tails = make_tails(self.line_bytes, self.seed)
        started = time.monotonic()
        base = self.records_generated
        while not self.stopping:
            remaining = self._remaining()
            if remaining == 0:
                self.wait()  # all generated: idle until stopped
                return
            n = self.chunk
            if self.rate is not None:
                due = int((time.monotonic() - started) * self.rate) + base
                n = min(n, due - self.records_generated)
                if n <= 0:
                    self.wait(self.TICK_S)
                    continue
            if remaining is not None:
                n = min(n, remaining)
            lines = self._chunk(n)
            self.store_records(lines, reliable=self.reliable)
            self.records_generated += n
            self.mark_healthy()

    def describe(self) -> str:
        """``generating``, as restart messages name the work."""
        return "generating"
