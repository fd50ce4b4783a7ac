"""The ``Idempotency-Key`` memory of :class:`~spark_receivers.receivers.http.HttpReceiver`.

A client that retries a POST (its answer was lost, the connection broke, it got a 429
after the store had begun) sends the same ``Idempotency-Key`` header again. The receiver
remembers, for ``window_s`` seconds and at most ``max_keys`` keys (the oldest forgotten
first), the answer of every request with a key whose records were stored: a repeat gets
that first answer again and stores nothing. Only stored requests are remembered: a
refused one (400, 413, 429 before the store, 503) may be retried and stored. A repeat
that arrives while the first request is still being stored is answered 409 with
``Retry-After``.

Across a restart of the receiver (or of its executor, or of the driver with
``get_or_create``) the keys of the window travel with the blocks: every store with a key
carries, as its source position, that key and the newest other keys of the window that
fit in ``position_bytes`` (:meth:`IdempotencyKeys.position_with`), each with its answer
and the wall-clock time it was stored. Keyed stores never overlap (they are grouped:
:mod:`.http_keyed_stores`), so the newest block the driver accepted carries every key
stored before it; the driver
keeps that position (in its WAL and checkpoint when there is one), and the restarted
receiver asks for it and remembers its keys that are still inside the window
(:meth:`IdempotencyKeys.remember_position`). A key older than the window, or pushed out
of the position by newer ones (more keys than ``position_bytes`` holds), is forgotten at
a restart: its retry is stored again (at least once). See docs/decisions/0014.

Thread contract: every method may be called from any thread (one lock, held briefly).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_KEY_LENGTH", "IdempotencyKeys", "Seen", "keys_of_position"]

MAX_KEY_LENGTH = 255
"""The longest ``Idempotency-Key`` taken (characters); a longer one is a 400."""


@dataclass(frozen=True)
class Seen:
    """What :meth:`IdempotencyKeys.begin` found: a first answer to replay, or a request busy."""

    answer: dict[str, Any] | None
    busy: bool = False


class IdempotencyKeys:
    """Remembered keys with their first answer, and the keys being stored."""

    def __init__(
        self,
        window_s: float,
        max_keys: int,
        now: Callable[[], float] = time.monotonic,
        wall_now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._now = now
        self._wall_now_ms = wall_now_ms
        self._lock = threading.Lock()
        self._answers: OrderedDict[str, tuple[float, dict[str, Any], str]] = OrderedDict()
        """Key -> (when stored, monotonic s; first answer; its entry of a position)."""
        self._busy: set[str] = set()
        self.replayed = 0
        """Repeats answered from memory (nothing stored)."""

    def begin(self, key: str) -> Seen | None:
        """None: a new key, now being stored (end it with :meth:`finish` or :meth:`abandon`)."""
        with self._lock:
            self._expire()
            if key in self._answers:
                self.replayed += 1
                return Seen(self._answers[key][1])
            if key in self._busy:
                return Seen(None, busy=True)
            self._busy.add(key)
            return None

    def finish(self, key: str, answer: dict[str, Any]) -> None:
        """The key's records were stored: remember ``answer`` for the window."""
        with self._lock:
            self._busy.discard(key)
            entry = _entry(key, answer.get("stored", 0), self._wall_now_ms())
            self._answers[key] = (self._now(), answer, entry)
            self._answers.move_to_end(key)
            while len(self._answers) > self.max_keys:
                self._answers.popitem(last=False)

    def abandon(self, key: str) -> None:
        """The key's request was refused before storing: a retry may store it."""
        with self._lock:
            self._busy.discard(key)

    def position_with(self, new: Sequence[tuple[str, int]], position_bytes: int) -> str:
        """The source position of a store of the keys ``new`` (``[(key, records)]``).

        Every key of ``new`` (the newest), then the remembered keys from the newest back,
        as long as the position stays within ``position_bytes`` (``new`` always whole):
        JSON ``{"idempotency_keys": [[key, stored, stored_at_ms], ...]}``, oldest first,
        the times wall-clock epoch ms so that another process (a restarted driver or
        executor) can tell their age.
        """
        wall_ms = self._wall_now_ms()
        own = [_entry(key, stored, wall_ms) for key, stored in new]
        names = {key for key, _ in new}
        parts: list[str] = []
        size = len(_HEAD) + len(_TAIL) + sum(len(e) + 1 for e in own)
        with self._lock:
            self._expire()
            for other, (_, _, entry) in reversed(self._answers.items()):
                if other in names:
                    continue
                size += len(entry) + 1
                if size > position_bytes:
                    break
                parts.append(entry)
        return _HEAD + ",".join([*reversed(parts), *own]) + _TAIL

    def remember_position(self, position: str | None) -> int:
        """Remember the keys of a position :meth:`position_with` made (the driver's last).

        Keys older than the window are left out; each kept key keeps its age (its window
        ends when it would have in the life that stored it). Returns how many were kept.
        """
        keys = keys_of_position(position)
        wall_ms, now = self._wall_now_ms(), self._now()
        kept = 0
        with self._lock:
            for key, stored, at_ms in sorted(keys, key=lambda k: k[2]):
                age_s = max(0.0, (wall_ms - at_ms) / 1000.0)
                if age_s > self.window_s or key in self._answers:
                    continue
                self._answers[key] = (now - age_s, {"stored": stored}, _entry(key, stored, at_ms))
                kept += 1
            # oldest first, as _expire and the cap expect (an earlier life's keys are older)
            for key in sorted(self._answers, key=lambda k: self._answers[k][0]):
                self._answers.move_to_end(key)
            while len(self._answers) > self.max_keys:
                self._answers.popitem(last=False)
        return kept

    def _expire(self) -> None:
        horizon = self._now() - self.window_s
        while self._answers:
            key, (at, _, _) = next(iter(self._answers.items()))
            if at >= horizon:
                return
            del self._answers[key]


_HEAD = '{"idempotency_keys":['
_TAIL = "]}"


def _entry(key: str, stored: int, at_ms: int) -> str:
    """A key's entry in a position, ASCII JSON (its length is its size in bytes)."""
    return json.dumps([key, stored, at_ms], separators=(",", ":"))


def keys_of_position(position: str | None) -> list[tuple[str, int, int]]:
    """``[(key, stored, stored_at_ms)]`` of a position ``position_with`` made, else [].

    A position of an earlier release (``{"idempotency_key": k, "stored": n}``, one key
    without a time) is read as that key stored now.
    """
    if position is None:
        return []
    try:
        raw = json.loads(position)
        if "idempotency_key" in raw:
            now_ms = time.time_ns() // 1_000_000
            return [(str(raw["idempotency_key"]), int(raw["stored"]), now_ms)]
        return [(str(k), int(n), int(at)) for k, n, at in raw["idempotency_keys"]]
    except (ValueError, KeyError, TypeError):
        return []
